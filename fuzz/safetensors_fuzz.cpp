// libFuzzer target: the .safetensors parser. Any input either parses or throws
// std::invalid_argument; a parsed file's float tensors read back with their element counts, and
// its tensors tile the data buffer in order.
#include <iattn/checkpoint/safetensors.hpp>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const auto f = iattn::safetensors::file::from_bytes(bytes, "fuzz input");
    std::uint64_t at = 0;
    for (const auto& t : f.tensors()) {
      if (t.begin != at || t.end < t.begin) std::abort();
      at = t.end;
      if (t.dtype == "F32" || t.dtype == "F64" || t.dtype == "F16" || t.dtype == "BF16") {
        if (t.numel() > (std::int64_t(1) << 24)) continue;  // a shape may promise more than memory holds
        if (std::int64_t(f.values<float>(t.name).size()) != t.numel()) std::abort();
      }
    }
  } catch (const std::invalid_argument&) {
    return 0;  // rejected with a message: fine
  }
  return 0;
}
