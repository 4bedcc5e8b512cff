// iattn/checkpoint/safetensors.hpp: reading Hugging Face's .safetensors checkpoints.
//
// The format: 8 bytes of little-endian u64 N, an N-byte JSON header, then the data buffer. The
// header maps each tensor's name to {"dtype", "shape", "data_offsets": [begin, end)} (offsets into
// the buffer), plus an optional "__metadata__" object of strings. The header is parsed with
// nlohmann-json (Debian's nlohmann-json3-dev: include this header only where it is installed);
// a file is memory-mapped, so opening a multi-gigabyte checkpoint reads only its header and the
// tensors asked for.
//
// Checked on open, as the reference implementation checks: the header length fits the file, the
// header is a JSON object of well-formed entries, every shape's element count times the dtype's
// size equals its byte range, and the ranges tile the buffer exactly (no gaps, no overlaps, no
// bytes left over). Reading converts F32, F64, F16 and BF16 to float or double (F16 and BF16
// exactly, F64 to float by rounding); other dtypes (integers, bool, F8) are listed in the header
// but refused when read. Every error is std::invalid_argument naming the file and, where one is
// concerned, the tensor: "safetensors: model.safetensors: tensor 'backbone.embeddings.weight' has
// shape (50280, 768), expected (50280, 1024)".
#pragma once

#include "../core/config.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace iattn::safetensors {

/// One tensor's entry in the header.
struct tensor_info {
  std::string name;
  std::string dtype;                ///< "F32", "F64", "F16", "BF16", "I64", ...
  std::vector<std::int64_t> shape;  ///< C order; empty for a scalar
  std::uint64_t begin = 0, end = 0;  ///< byte range in the data buffer
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;  // the parser rejects counts that overflow
    return n;
  }
};

namespace detail {

[[noreturn]] inline void fail(const std::string& label, const std::string& what) {
  throw std::invalid_argument("safetensors: " + label + ": " + what);
}

/// Bytes per element of a dtype, 0 when the dtype is unknown.
inline std::uint64_t dtype_size(const std::string& d) {
  static const std::map<std::string, std::uint64_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"I64", 8},     {"U64", 8}, {"F64", 8}};
  const auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

inline std::string shape_string(const std::vector<std::int64_t>& s) {
  std::string out = "(";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf, NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;  // ±0
  } else {  // subnormal: value man · 2^-24, exact in float
    float v = float(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float bf16_to_float(std::uint16_t h) {
  const std::uint32_t bits = std::uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// The bytes of a file: memory-mapped (read only), or owned (from_bytes).
struct storage {
  const char* data = nullptr;
  std::size_t size = 0;
  void* map = nullptr;
  std::string owned;
  storage() = default;
  storage(const storage&) = delete;
  storage& operator=(const storage&) = delete;
  ~storage() {
    if (map) ::munmap(map, size);
  }
};

}  // namespace detail

/// A .safetensors file: its header parsed and checked, its data read on demand.
class file {
 public:
  /// Opens and memory-maps `path`, parses and checks the header.
  static file open(const std::string& path) {
    auto st = std::make_shared<detail::storage>();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) detail::fail(path, std::string("cannot open (") + std::strerror(errno) + ")");
    struct ::stat sb {};
    if (::fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
      ::close(fd);
      detail::fail(path, "not a regular file");
    }
    st->size = std::size_t(sb.st_size);
    if (st->size > 0) {
      void* m = ::mmap(nullptr, st->size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (m == MAP_FAILED) {
        const int e = errno;
        ::close(fd);
        detail::fail(path, std::string("cannot map (") + std::strerror(e) + ")");
      }
      st->map = m;
      st->data = static_cast<const char*>(m);
    }
    ::close(fd);
    return file(std::move(st), path);
  }
  /// Parses bytes held in memory (a copy is kept); `label` names them in errors.
  static file from_bytes(std::string bytes, const std::string& label) {
    auto st = std::make_shared<detail::storage>();
    st->owned = std::move(bytes);
    st->data = st->owned.data();
    st->size = st->owned.size();
    return file(std::move(st), label);
  }

  const std::string& label() const { return label_; }
  /// The tensors in the order of their data in the file.
  const std::vector<tensor_info>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }

  /// The integers i, ascending, for which a tensor is named prefix + i + suffix (decimal digits
  /// only): the layer indices of "backbone.layers.<i>.mixer.A_log" and the like.
  std::vector<std::int64_t> indices(const std::string& prefix, const std::string& suffix) const {
    std::vector<std::int64_t> found;
    for (const auto& t : tensors_) {
      const std::string& n = t.name;
      if (n.size() <= prefix.size() + suffix.size() || n.compare(0, prefix.size(), prefix) != 0 ||
          n.compare(n.size() - suffix.size(), suffix.size(), suffix) != 0)
        continue;
      const std::string num = n.substr(prefix.size(), n.size() - prefix.size() - suffix.size());
      if (num.size() > 18 || num.find_first_not_of("0123456789") != std::string::npos) continue;
      found.push_back(std::stoll(num));
    }
    std::sort(found.begin(), found.end());
    found.erase(std::unique(found.begin(), found.end()), found.end());
    return found;
  }

  /// The entry of `name`; a missing tensor throws, naming it and the closest names present.
  const tensor_info& info(const std::string& name) const {
    const auto it = index_.find(name);
    if (it == index_.end()) {
      std::string near;
      const auto dot = name.rfind('.');
      const std::string tail = dot == std::string::npos ? name : name.substr(dot);
      int shown = 0;
      for (const auto& t : tensors_)
        if (t.name.size() >= tail.size() && t.name.compare(t.name.size() - tail.size(), tail.size(), tail) == 0 && shown < 5) {
          near += (shown++ ? ", '" : "'") + t.name + "'";
        }
      detail::fail(label_, "no tensor '" + name + "' (" + std::to_string(tensors_.size()) + " tensors" +
                               (near.empty() ? std::string(")") : "; with the same suffix: " + near + ")"));
    }
    return tensors_[it->second];
  }

  /// The tensor's values in C order, converted to T (float or double).
  template <Scalar T>
  std::vector<T> values(const std::string& name) const {
    const tensor_info& t = info(name);
    const std::size_t n = std::size_t(t.numel());
    std::vector<T> out(n);
    const char* p = st_->data + data_start_ + t.begin;
    if (t.dtype == "F32") {
      for (std::size_t i = 0; i < n; ++i) out[i] = T(load<float>(p + 4 * i));
    } else if (t.dtype == "F64") {
      for (std::size_t i = 0; i < n; ++i) out[i] = T(load<double>(p + 8 * i));
    } else if (t.dtype == "F16") {
      for (std::size_t i = 0; i < n; ++i) out[i] = T(detail::half_to_float(load<std::uint16_t>(p + 2 * i)));
    } else if (t.dtype == "BF16") {
      for (std::size_t i = 0; i < n; ++i) out[i] = T(detail::bf16_to_float(load<std::uint16_t>(p + 2 * i)));
    } else {
      detail::fail(label_, "tensor '" + name + "' has dtype " + t.dtype + "; only F32, F64, F16 and BF16 convert to floating point");
    }
    return out;
  }

  /// The tensor as a (rows, cols) row-major matrix of its C-order values: the shape given when both
  /// are given (the element counts must agree: a checkpoint tensor keeps its own index order,
  /// flattened), else (1, n) for rank 0 and 1, (shape[0], rest) for rank >= 2.
  template <Scalar T>
  Matrix<T> matrix(const std::string& name, Index rows = -1, Index cols = -1) const {
    const tensor_info& t = info(name);
    const std::int64_t n = t.numel();
    if (rows < 0 || cols < 0) {
      rows = t.shape.size() >= 2 ? Index(t.shape[0]) : 1;
      cols = 1;
      for (std::size_t d = t.shape.size() >= 2 ? 1 : 0; d < t.shape.size(); ++d) cols *= Index(t.shape[d]);
    }
    if (std::int64_t(rows) * std::int64_t(cols) != n)
      detail::fail(label_, "tensor '" + name + "' has shape " + detail::shape_string(t.shape) + " (" + std::to_string(n) +
                               " values), expected (" + std::to_string(rows) + ", " + std::to_string(cols) + ")");
    const std::vector<T> v = values<T>(name);
    Matrix<T> m(rows, cols);
    std::copy(v.begin(), v.end(), m.data());
    return m;
  }

  /// Throws unless `name` has `rank` axes; `expected` describes them in the message ("(d_inner, d_state)").
  void require_rank(const std::string& name, std::size_t rank, const std::string& expected) const {
    const tensor_info& t = info(name);
    if (t.shape.size() != rank)
      detail::fail(label_, "tensor '" + name + "' has shape " + detail::shape_string(t.shape) + ", expected " + expected);
  }

  /// Throws unless `name` has exactly `shape`.
  void require_shape(const std::string& name, const std::vector<std::int64_t>& shape) const {
    const tensor_info& t = info(name);
    if (t.shape != shape)
      detail::fail(label_, "tensor '" + name + "' has shape " + detail::shape_string(t.shape) + ", expected " + detail::shape_string(shape));
  }

 private:
  file(std::shared_ptr<detail::storage> st, std::string label) : st_(std::move(st)), label_(std::move(label)) { parse(); }

  template <class V>
  static V load(const char* p) {
    V v;
    std::memcpy(&v, p, sizeof(V));  // the format does not promise alignment
    return v;
  }

  void parse() {
    const std::size_t size = st_->size;
    if (size < 8) detail::fail(label_, "truncated: " + std::to_string(size) + " bytes, the header length alone takes 8");
    std::uint64_t hlen = 0;
    for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | std::uint8_t(st_->data[i]);
    if (hlen > size - 8)
      detail::fail(label_, "truncated: the header claims " + std::to_string(hlen) + " bytes but " + std::to_string(size - 8) + " follow");
    if (hlen > (std::uint64_t(100) << 20)) detail::fail(label_, "header of " + std::to_string(hlen) + " bytes (the format allows 100 MB)");
    data_start_ = 8 + std::size_t(hlen);
    const std::size_t buffer = size - data_start_;
    nlohmann::ordered_json h;
    try {
      h = nlohmann::ordered_json::parse(st_->data + 8, st_->data + 8 + hlen);
    } catch (const nlohmann::json::exception& e) {
      detail::fail(label_, std::string("the header is not valid JSON (") + e.what() + ")");
    }
    if (!h.is_object()) detail::fail(label_, "the header is not a JSON object");
    for (auto it = h.begin(); it != h.end(); ++it) {
      const std::string& key = it.key();
      const auto& v = it.value();
      if (key == "__metadata__") {
        if (!v.is_object()) detail::fail(label_, "__metadata__ is not an object");
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string()) detail::fail(label_, "__metadata__ entry '" + m.key() + "' is not a string");
          metadata_[m.key()] = m.value().template get<std::string>();
        }
        continue;
      }
      auto bad = [&](const std::string& what) { detail::fail(label_, "tensor '" + key + "': " + what); };
      if (!v.is_object()) bad("the entry is not an object");
      tensor_info t;
      t.name = key;
      if (!v.contains("dtype") || !v["dtype"].is_string()) bad("no dtype string");
      t.dtype = v["dtype"].template get<std::string>();
      const std::uint64_t es = detail::dtype_size(t.dtype);
      if (es == 0) bad("unknown dtype '" + t.dtype + "'");
      if (!v.contains("shape") || !v["shape"].is_array()) bad("no shape array");
      std::uint64_t count = 1;
      bool overflow = false;
      for (const auto& d : v["shape"]) {
        if (!d.is_number_unsigned() && !(d.is_number_integer() && d.template get<std::int64_t>() >= 0)) bad("shape entries must be non-negative integers");
        const std::uint64_t x = d.template get<std::uint64_t>();
        if (x > std::uint64_t(std::numeric_limits<std::int64_t>::max())) overflow = true;
        if (x != 0 && count > std::numeric_limits<std::uint64_t>::max() / 8 / x) overflow = true;
        else count *= x;
        t.shape.push_back(std::int64_t(x));
      }
      if (overflow || count > std::uint64_t(std::numeric_limits<std::int64_t>::max()) / es) bad("shape " + detail::shape_string(t.shape) + " has too many elements");
      if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2 ||
          !v["data_offsets"][0].is_number_unsigned() || !v["data_offsets"][1].is_number_unsigned())
        bad("data_offsets must be two non-negative integers");
      t.begin = v["data_offsets"][0].template get<std::uint64_t>();
      t.end = v["data_offsets"][1].template get<std::uint64_t>();
      if (t.begin > t.end || t.end > buffer)
        bad("data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + ") outside the data buffer of " +
            std::to_string(buffer) + " bytes (a truncated file?)");
      if (t.end - t.begin != count * es)
        bad("shape " + detail::shape_string(t.shape) + " of " + t.dtype + " needs " + std::to_string(count * es) + " bytes, data_offsets give " +
            std::to_string(t.end - t.begin));
      if (index_.count(key)) bad("listed twice");
      index_[key] = tensors_.size();
      tensors_.push_back(std::move(t));
    }
    // The ranges tile the buffer: sorted by begin, each starts where the previous ended.
    std::vector<std::size_t> order(tensors_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return std::make_pair(tensors_[a].begin, tensors_[a].end) < std::make_pair(tensors_[b].begin, tensors_[b].end);
    });
    std::uint64_t at = 0;
    for (std::size_t i : order) {
      const tensor_info& t = tensors_[i];
      if (t.begin != at)
        detail::fail(label_, "tensor '" + t.name + "' starts at byte " + std::to_string(t.begin) + " of the data buffer, expected " +
                                 std::to_string(at) + " (the ranges must tile the buffer: no gaps, no overlaps)");
      at = t.end;
    }
    if (at != buffer)
      detail::fail(label_, std::to_string(buffer - at) + " bytes after the last tensor's data (the ranges must tile the buffer)");
    std::vector<tensor_info> sorted;
    sorted.reserve(order.size());
    for (std::size_t i : order) sorted.push_back(tensors_[i]);
    tensors_ = std::move(sorted);
    for (std::size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  }

  std::shared_ptr<detail::storage> st_;
  std::string label_;
  std::size_t data_start_ = 0;
  std::vector<tensor_info> tensors_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace iattn::safetensors
