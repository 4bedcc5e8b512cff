// The .safetensors reader against files written by Hugging Face's `safetensors` package
// (tools/reference/make_safetensors_fixtures.py), each tensor's values beside it as a numpy .npy:
// every float dtype converted exactly, shapes, order, metadata, and every malformed input refused
// with a message naming the file and the tensor.
#include <iattn/checkpoint/safetensors.hpp>
#include <iattn/explain/npy.hpp>

#include "support/test_common.hpp"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>

using Catch::Matchers::Contains;
using namespace test;
namespace st = iattn::safetensors;

namespace {

const std::string dir = std::string(IATTN_TEST_DATA_DIR) + "/safetensors/";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// A file assembled by hand: the 8-byte length, the header, then `data`.
std::string assemble(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[std::size_t(i)] = char((n >> (8 * i)) & 0xff);
  return out + header + data;
}

bool same_bits(double a, double b) { return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b)); }

}  // namespace

TEST_CASE("safetensors: every float dtype, exactly as the reference wrote it", "[safetensors]") {
  const auto f = st::file::open(dir + "mixed.safetensors");
  for (const char* name : {"backbone.layers.0.mixer.A_log", "backbone.layers.0.mixer.conv1d.weight", "w64", "half", "bf", "scalar", "empty"}) {
    INFO(name);
    std::string npy = name;
    for (char& c : npy)
      if (c == '.') c = '_';
    const auto ref = iattn::npy::read(dir + npy + ".npy");
    const std::vector<double> d = f.values<double>(name);
    const std::vector<float> s = f.values<float>(name);
    REQUIRE(std::int64_t(d.size()) == ref.size());
    REQUIRE(std::int64_t(s.size()) == ref.size());
    std::vector<std::int64_t> shape(ref.shape.begin(), ref.shape.end());
    REQUIRE(f.info(name).shape == shape);
    for (std::size_t i = 0; i < d.size(); ++i) {
      REQUIRE(same_bits(d[i], ref.data[i]));
      REQUIRE(same_bits(double(s[i]), double(float(ref.data[i]))));
    }
  }
  // The half tensor's specials: +inf, -0 and the smallest subnormal, 2^-24.
  const auto h = f.values<double>("half");
  REQUIRE(std::isinf(h[0]));
  REQUIRE((h[1] == 0.0 && std::signbit(h[1])));
  REQUIRE(h[2] == std::ldexp(1.0, -24));
}

TEST_CASE("safetensors: header, order, metadata and matrices", "[safetensors]") {
  const auto f = st::file::open(dir + "mixed.safetensors");
  REQUIRE(f.tensors().size() == 8);
  for (std::size_t i = 1; i < f.tensors().size(); ++i) REQUIRE(f.tensors()[i - 1].end == f.tensors()[i].begin);
  REQUIRE(f.metadata().at("format") == "pt");
  REQUIRE(f.metadata().at("source") == "iattn fixture");
  REQUIRE(f.contains("ints"));
  REQUIRE_FALSE(f.contains("__metadata__"));
  REQUIRE(f.info("ints").dtype == "I64");
  REQUIRE(f.info("bf").dtype == "BF16");
  // Default matrix shapes: rank >= 2 keeps the first axis, the rest flattened; rank 0 and 1 are rows.
  const MatD conv = f.matrix<double>("backbone.layers.0.mixer.conv1d.weight");
  REQUIRE((conv.rows() == 6 && conv.cols() == 4));
  const auto flat = f.values<double>("backbone.layers.0.mixer.conv1d.weight");
  for (Index r = 0; r < 6; ++r)
    for (Index c = 0; c < 4; ++c) REQUIRE(conv(r, c) == flat[std::size_t(r * 4 + c)]);
  REQUIRE(f.matrix<float>("half").rows() == 1);
  REQUIRE(f.matrix<float>("half").cols() == 7);
  REQUIRE((f.matrix<double>("scalar").rows() == 1 && f.matrix<double>("scalar")(0, 0) == 1.5));
  REQUIRE((f.matrix<double>("empty").rows() == 0 && f.matrix<double>("empty").cols() == 3));
  const MatD w = f.matrix<double>("w64", 3, 4);  // any (rows, cols) with the same count: C order
  REQUIRE(w(2, 3) == f.values<double>("w64")[11]);
  // from_bytes parses the same bytes the same way.
  const auto g = st::file::from_bytes(slurp(dir + "mixed.safetensors"), "in memory");
  REQUIRE(g.values<double>("bf") == f.values<double>("bf"));
  f.require_shape("bf", {2, 3});
  // Layer indices by name pattern: only decimal digits between prefix and suffix count.
  REQUIRE(f.indices("backbone.layers.", ".mixer.A_log") == std::vector<std::int64_t>{0});
  REQUIRE(f.indices("backbone.layers.", ".weight").empty());  // "0.mixer.conv1d" is not a number
  REQUIRE(f.indices("w", "") == std::vector<std::int64_t>{64});  // "w64"
}

TEST_CASE("safetensors: errors name the file and the tensor", "[safetensors]") {
  const std::string path = dir + "mixed.safetensors";
  const auto f = st::file::open(path);
  REQUIRE_THROWS_WITH(f.values<float>("backbone.layers.0.mixer.B_log"),
                      Contains("safetensors: " + path + ": no tensor 'backbone.layers.0.mixer.B_log'"));
  REQUIRE_THROWS_WITH(f.values<float>("backbone.layers.1.mixer.A_log"), Contains("with the same suffix: 'backbone.layers.0.mixer.A_log'"));
  REQUIRE_THROWS_WITH(f.values<double>("ints"), Contains("tensor 'ints' has dtype I64; only F32, F64, F16 and BF16"));
  REQUIRE_THROWS_WITH(f.matrix<float>("bf", 4, 2), Contains("tensor 'bf' has shape (2, 3) (6 values), expected (4, 2)"));
  REQUIRE_THROWS_WITH(f.require_shape("half", {6}), Contains("tensor 'half' has shape (7,), expected (6,)"));
  REQUIRE_THROWS_WITH(st::file::open(dir + "missing.safetensors"), Contains("missing.safetensors: cannot open"));

  const std::string bytes = slurp(path);
  using F = st::file;
  // Truncated: inside the length, inside the header, inside the last tensor's data.
  REQUIRE_THROWS_WITH(F::from_bytes(bytes.substr(0, 5), "t"), Contains("safetensors: t: truncated: 5 bytes"));
  REQUIRE_THROWS_WITH(F::from_bytes(bytes.substr(0, 40), "t"), Contains("truncated: the header claims"));
  REQUIRE_THROWS_WITH(F::from_bytes(bytes.substr(0, bytes.size() - 3), "t"),
                      Contains("tensor 'half': data_offsets") && Contains("outside the data buffer"));
  // Bytes left over after the last tensor.
  REQUIRE_THROWS_WITH(F::from_bytes(bytes + "xyz", "t"), Contains("3 bytes after the last tensor's data"));
  // Hand-made headers.
  const std::string four(4, '\0'), eight(8, '\0');
  REQUIRE_THROWS_WITH(F::from_bytes(assemble("{\"a\": [1, 2", four), "t"), Contains("the header is not valid JSON"));
  REQUIRE_THROWS_WITH(F::from_bytes(assemble("[1, 2]", ""), "t"), Contains("the header is not a JSON object"));
  REQUIRE_THROWS_WITH(F::from_bytes(assemble(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight), "t"),
                      Contains("tensor 'a' starts at byte 4 of the data buffer, expected 0"));
  REQUIRE_THROWS_WITH(
      F::from_bytes(assemble(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", four), "t"),
      Contains("starts at byte 0 of the data buffer, expected 4"));
  REQUIRE_THROWS_WITH(F::from_bytes(assemble(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", four), "t"),
                      Contains("tensor 'a': shape (2,) of F32 needs 8 bytes, data_offsets give 4"));
  REQUIRE_THROWS_WITH(F::from_bytes(assemble(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", four), "t"),
                      Contains("tensor 'a': shape entries must be non-negative integers"));
  REQUIRE_THROWS_WITH(F::from_bytes(assemble(R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}})", four), "t"),
                      Contains("tensor 'a': unknown dtype 'Q4'"));
  REQUIRE_THROWS_WITH(F::from_bytes(assemble(R"({"a":{"dtype":"F32","shape":[1]}})", four), "t"),
                      Contains("tensor 'a': data_offsets must be two non-negative integers"));
  REQUIRE_THROWS_WITH(
      F::from_bytes(assemble(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}})", four), "t"),
      Contains("has too many elements"));
  REQUIRE_THROWS_WITH(F::from_bytes(assemble(R"({"__metadata__":{"n":1}})", ""), "t"), Contains("__metadata__ entry 'n' is not a string"));
  // An empty file list with nothing after it is a valid (empty) checkpoint.
  REQUIRE(F::from_bytes(assemble("{}", ""), "t").tensors().empty());
}
