// iattn/explain/io.hpp: writing output files so that a failure leaves nothing behind.
#pragma once

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace iattn::explain {

/// Writes `bytes` to `path` through a temporary file in the same directory, renamed over the target
/// only once complete. Throws std::invalid_argument ("<where>: <path>: ...") when the directory does
/// not exist or is not writable or the rename fails; no partial file is left in any case.
inline void write_file_atomic(const std::string& path, const std::string& bytes, const char* where) {
  namespace fs = std::filesystem;
  auto fail = [&](const std::string& what) { throw std::invalid_argument(std::string(where) + ": " + path + ": " + what); };
  const fs::path target(path);
  const fs::path tmp = target.parent_path() / (target.filename().string() + ".tmp-iattn");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot open for writing");
    out.write(bytes.data(), std::streamsize(bytes.size()));
    out.flush();
    if (!out) {
      out.close();
      std::error_code ec;
      fs::remove(tmp, ec);
      fail("write failed");
    }
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    fail("cannot move the written file into place (" + ec.message() + ")");
  }
}

}  // namespace iattn::explain
