// iattn/explain/npy.hpp: numpy's .npy format, so matrices and tensors move to and from Python.
//
// Reading accepts format versions 1.0, 2.0 and 3.0, little-endian float32 ('<f4') and float64 ('<f8')
// in C order, any rank. Fortran order, other dtypes (integers, big-endian, complex, objects) and
// malformed or truncated files throw std::invalid_argument naming the file and what was found.
// Writing produces version 1.0 (2.0 when the header would not fit 65535 bytes), C order, aligned to
// 64 bytes as numpy does. A write goes to a temporary file in the same directory that is renamed
// over the target only when complete, so a failed write leaves no partial file behind.
#pragma once

#include "../core/config.hpp"
#include "../core/error.hpp"
#include "io.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace iattn::npy {

/// An n-dimensional array read from a .npy file: C-order data, as float64 whatever the file's dtype
/// (float32 values are exact in double), and the dtype the file had.
struct array {
  std::vector<std::int64_t> shape;
  std::vector<double> data;
  std::string dtype;  ///< "<f4" or "<f8"
  std::int64_t size() const {
    for (auto s : shape)
      if (s == 0) return 0;
    std::int64_t n = 1;
    for (auto s : shape) n *= s;  // parse() rejects shapes whose product does not fit
    return n;
  }
};

namespace detail {

inline void fail(const std::string& path, const std::string& what) {
  throw std::invalid_argument("npy: " + path + ": " + what);
}

/// The value of `key` in numpy's header dict ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }").
inline std::string field(const std::string& header, const std::string& key, const std::string& path) {
  const auto k = header.find("'" + key + "'");
  if (k == std::string::npos) fail(path, "header has no '" + key + "' entry: " + header);
  auto p = header.find(':', k);
  if (p == std::string::npos) fail(path, "malformed header: " + header);
  ++p;
  while (p < header.size() && header[p] == ' ') ++p;
  std::size_t e = p;
  if (p < header.size() && header[p] == '(') {
    e = header.find(')', p);
    if (e == std::string::npos) fail(path, "malformed shape in header: " + header);
    return header.substr(p, e - p + 1);
  }
  if (p < header.size() && (header[p] == '\'' || header[p] == '"')) {
    e = header.find(header[p], p + 1);
    if (e == std::string::npos) fail(path, "malformed string in header: " + header);
    return header.substr(p + 1, e - p - 1);
  }
  while (e < header.size() && header[e] != ',' && header[e] != '}') ++e;
  auto v = header.substr(p, e - p);
  while (!v.empty() && v.back() == ' ') v.pop_back();
  return v;
}

/// numpy's shape tuple: "()", "(5,)", "(2, 3)": non-negative integers separated by commas. Rejects
/// anything else, and shapes whose element count does not fit 63 bits.
inline std::vector<std::int64_t> parse_shape(const std::string& s, const std::string& path) {
  auto bad = [&](const char* why) { fail(path, "shape " + s + " " + why); };
  if (s.size() < 2 || s.front() != '(' || s.back() != ')') bad("is not a tuple");
  std::vector<std::int64_t> shape;
  std::size_t i = 1;
  const std::size_t end = s.size() - 1;
  while (true) {
    while (i < end && s[i] == ' ') ++i;
    if (i == end) break;
    std::size_t j = i;
    while (j < end && s[j] >= '0' && s[j] <= '9') ++j;
    if (j == i) bad("is not a tuple of non-negative integers");
    if (j - i > 15) bad("has an implausible extent");
    shape.push_back(std::stoll(s.substr(i, j - i)));
    i = j;
    while (i < end && s[i] == ' ') ++i;
    if (i == end) break;
    if (s[i] != ',') bad("is not a tuple of non-negative integers");
    ++i;
  }
  if (shape.size() > 32) bad("has more than 32 dimensions");
  std::int64_t n = 1;
  for (auto e : shape)
    if (e != 0 && n > std::numeric_limits<std::int64_t>::max() / e) bad("has more elements than 2^63");
    else n *= e == 0 ? 1 : e;
  return shape;
}

inline bool little_endian() {
  const std::uint16_t one = 1;
  unsigned char b;
  std::memcpy(&b, &one, 1);
  return b == 1;
}

inline std::string shape_tuple(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "") + (i + 1 < shape.size() ? " " : "");
  return s + ")";
}

}  // namespace detail

/// Parses the bytes of a .npy file; `name` is used in error messages (see the header comment for what
/// is accepted). Never reads past the bytes given and never allocates more than they can fill.
inline array parse(const std::string& bytes, const std::string& name) {
  if (!detail::little_endian()) detail::fail(name, "reading .npy needs a little-endian host");
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY", 6) != 0) detail::fail(name, "not a .npy file (bad magic string)");
  const auto byte = [&](std::size_t i) { return std::uint32_t(static_cast<unsigned char>(bytes[i])); };
  const std::uint32_t major = byte(6);
  std::size_t pos = 0;
  std::uint32_t hlen = 0;
  if (major == 1) {
    hlen = byte(8) | (byte(9) << 8);
    pos = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) detail::fail(name, "truncated header");
    hlen = byte(8) | (byte(9) << 8) | (byte(10) << 16) | (byte(11) << 24);
    pos = 12;
  } else {
    detail::fail(name, "format version " + std::to_string(major) + "." + std::to_string(byte(7)) + " is not supported (1.0, 2.0 and 3.0 are)");
  }
  if (hlen > bytes.size() - pos) detail::fail(name, "truncated header: " + std::to_string(hlen) + " bytes announced");
  const std::string header = bytes.substr(pos, hlen);
  pos += hlen;
  array a;
  a.dtype = detail::field(header, "descr", name);
  if (a.dtype != "<f4" && a.dtype != "<f8")
    detail::fail(name, "dtype '" + a.dtype + "' is not supported (expected little-endian float32 '<f4' or float64 '<f8')");
  const std::string fortran = detail::field(header, "fortran_order", name);
  if (fortran == "True") detail::fail(name, "Fortran-order arrays are not supported; save with numpy.ascontiguousarray first");
  if (fortran != "False") detail::fail(name, "fortran_order is '" + fortran + "', expected True or False");
  a.shape = detail::parse_shape(detail::field(header, "shape", name), name);
  const std::size_t width = a.dtype == "<f4" ? 4 : 8, available = (bytes.size() - pos) / width;
  std::size_t n = 1;
  for (auto e : a.shape)  // the product, stopped as soon as it exceeds what the bytes hold
    n = (e == 0 || n == 0) ? 0 : (std::size_t(e) > available / n + 1 ? available + 1 : n * std::size_t(e));
  if (n > available)
    detail::fail(name, "truncated data: shape " + detail::shape_tuple(a.shape) + " needs more " + (width == 4 ? "float32" : "float64") +
                           " values than the " + std::to_string(available) + " present");
  a.data.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (width == 4) {
      float f;
      std::memcpy(&f, bytes.data() + pos + 4 * i, 4);
      a.data[i] = f;
    } else {
      std::memcpy(&a.data[i], bytes.data() + pos + 8 * i, 8);
    }
  }
  return a;
}

/// Reads a .npy file (see the header comment for what is accepted).
inline array read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) detail::fail(path, "cannot open for reading");
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return parse(bytes, path);
}

/// Reads a 2-D array (a 1-D array reads as one row) into a row-major matrix.
template <Scalar T>
Matrix<T> read_matrix(const std::string& path) {
  const array a = read(path);
  if (a.shape.size() > 2 || a.shape.empty())
    detail::fail(path, "shape " + detail::shape_tuple(a.shape) + " is not a matrix (expected 1 or 2 dimensions)");
  const Index rows = a.shape.size() == 2 ? a.shape[0] : 1, cols = a.shape.back();
  Matrix<T> m(rows, cols);
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = T(a.data[std::size_t(i)]);
  return m;
}

/// Writes n values of T (float or double) with the given C-order shape.
template <Scalar T>
void write(const std::string& path, const T* data, const std::vector<std::int64_t>& shape) {
  if (!detail::little_endian()) detail::fail(path, "writing .npy needs a little-endian host");
  std::int64_t n = 1;
  for (auto s : shape) {
    if (s < 0) detail::fail(path, "shape " + detail::shape_tuple(shape) + " has a negative extent");
    n *= s;
  }
  std::string header = std::string("{'descr': '") + (sizeof(T) == 4 ? "<f4" : "<f8") +
                       "', 'fortran_order': False, 'shape': " + detail::shape_tuple(shape) + ", }";
  // numpy pads with spaces and a final newline so that the data starts at a multiple of 64
  const bool v2 = header.size() + 1 + 10 > 65535;
  const std::size_t prefix = v2 ? 12 : 10;
  const std::size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;
  header.append(total - prefix - header.size() - 1, ' ');
  header.push_back('\n');

  std::string bytes("\x93NUMPY", 6);
  bytes.push_back(char(v2 ? 2 : 1));
  bytes.push_back(0);
  const auto hl = static_cast<std::uint32_t>(header.size());
  for (int i = 0; i < (v2 ? 4 : 2); ++i) bytes.push_back(char((hl >> (8 * i)) & 0xff));
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(data), std::size_t(n) * sizeof(T));
  explain::write_file_atomic(path, bytes, "npy");
}

/// Writes a matrix (row-major, any Eigen dense expression) as a 2-D array.
template <class M>
void write(const std::string& path, const Eigen::MatrixBase<M>& m) {
  using T = typename M::Scalar;
  const Matrix<T> c = m;  // row-major copy
  write<T>(path, c.data(), {std::int64_t(c.rows()), std::int64_t(c.cols())});
}

}  // namespace iattn::npy
