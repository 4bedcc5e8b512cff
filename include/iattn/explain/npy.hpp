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
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
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

inline std::vector<std::int64_t> parse_shape(const std::string& s, const std::string& path) {
  std::vector<std::int64_t> shape;
  std::size_t i = 1;  // after '('
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == ',')) ++i;
    if (i >= s.size() || s[i] == ')') break;
    std::size_t j = i;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
    if (j == i) fail(path, "shape " + s + " is not a tuple of non-negative integers");
    shape.push_back(std::stoll(s.substr(i, j - i)));
    i = j;
  }
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

/// Reads a .npy file (see the header comment for what is accepted).
inline array read(const std::string& path) {
  if (!detail::little_endian()) detail::fail(path, "reading .npy needs a little-endian host");
  std::ifstream in(path, std::ios::binary);
  if (!in) detail::fail(path, "cannot open for reading");
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) detail::fail(path, "not a .npy file (bad magic string)");
  const int major = static_cast<unsigned char>(magic[6]);
  std::uint32_t hlen = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!in.read(reinterpret_cast<char*>(b), 2)) detail::fail(path, "truncated header");
    hlen = std::uint32_t(b[0]) | (std::uint32_t(b[1]) << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (!in.read(reinterpret_cast<char*>(b), 4)) detail::fail(path, "truncated header");
    hlen = std::uint32_t(b[0]) | (std::uint32_t(b[1]) << 8) | (std::uint32_t(b[2]) << 16) | (std::uint32_t(b[3]) << 24);
  } else {
    detail::fail(path, "format version " + std::to_string(major) + "." + std::to_string(int(static_cast<unsigned char>(magic[7]))) +
                           " is not supported (1.0, 2.0 and 3.0 are)");
  }
  if (hlen > (1u << 24)) detail::fail(path, "header length " + std::to_string(hlen) + " is implausible");
  std::string header(hlen, '\0');
  if (!in.read(header.data(), hlen)) detail::fail(path, "truncated header");
  array a;
  a.dtype = detail::field(header, "descr", path);
  if (a.dtype != "<f4" && a.dtype != "<f8")
    detail::fail(path, "dtype '" + a.dtype + "' is not supported (expected little-endian float32 '<f4' or float64 '<f8')");
  const std::string fortran = detail::field(header, "fortran_order", path);
  if (fortran == "True") detail::fail(path, "Fortran-order arrays are not supported; save with numpy.ascontiguousarray first");
  if (fortran != "False") detail::fail(path, "fortran_order is '" + fortran + "', expected True or False");
  a.shape = detail::parse_shape(detail::field(header, "shape", path), path);
  const std::int64_t n = a.size();
  const std::size_t width = a.dtype == "<f4" ? 4 : 8;
  a.data.resize(std::size_t(n));
  if (width == 4) {
    std::vector<float> buf(static_cast<std::size_t>(n));
    if (n > 0 && !in.read(reinterpret_cast<char*>(buf.data()), std::streamsize(n * 4)))
      detail::fail(path, "truncated data: expected " + std::to_string(n) + " float32 values for shape " + detail::shape_tuple(a.shape));
    for (std::size_t i = 0; i < buf.size(); ++i) a.data[i] = buf[i];
  } else if (n > 0 && !in.read(reinterpret_cast<char*>(a.data.data()), std::streamsize(n * 8))) {
    detail::fail(path, "truncated data: expected " + std::to_string(n) + " float64 values for shape " + detail::shape_tuple(a.shape));
  }
  return a;
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
