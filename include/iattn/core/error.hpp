// iattn/core/error.hpp: the checks every public entry point runs at the door.
//
// Errors name the function, the argument, the shape it has and the shape it should have:
//   semiseparable: B has shape (5, 7) but expected (L=5, G*N=8)
#pragma once

#include "config.hpp"

#include <sstream>
#include <stdexcept>
#include <string>

namespace iattn::detail {

inline std::string shape_string(Index rows, Index cols) {
  std::ostringstream s;
  s << '(' << rows << ", " << cols << ')';
  return s.str();
}

[[noreturn]] inline void fail(const std::string& where, const std::string& what) {
  throw std::invalid_argument(where + ": " + what);
}

/// Throws unless `ok`, with "<where>: <argument> has shape (r, c) but expected <expected>".
inline void require_shape(bool ok, const char* where, const char* argument, Index rows, Index cols,
                          const std::string& expected) {
  if (!ok)
    fail(where, std::string(argument) + " has shape " + shape_string(rows, cols) + " but expected " +
                    expected);
}

/// Two extents that must agree unless one of them is `any`; returns the fixed one.
inline Index merge_extent(Index a, Index b, const char* where, const char* what) {
  if (a == any) return b;
  if (b == any || a == b) return a;
  std::ostringstream s;
  s << "operands disagree on " << what << ": left has " << a << ", right has " << b;
  fail(where, s.str());
}

// ---- the arguments of an evaluation (apply, materialize, ...), on every backend ------------------

inline std::string extent_string(Index v, const char* letter) {
  return v == any ? std::string(letter) : std::string(letter) + "=" + std::to_string(v);
}

/// Throws unless X of shape (rows, cols) fits an expression of length L and D channels (either
/// `any`). Not a template: one copy of the message building for every expression type.
inline void check_input_extents(Index L, Index D, Index rows, Index cols, const char* where, const char* argument) {
  if ((L == any || rows == L) && (D == any || cols == D)) return;
  std::string expected = "(";
  expected += extent_string(L, "L");
  expected += ", ";
  expected += extent_string(D, "D");
  expected += ")";
  require_shape(false, where, argument, rows, cols, expected);
}

template <class H>
void check_input(const H& h, Index rows, Index cols, const char* where, const char* argument) {
  check_input_extents(h.length(), h.channels(), rows, cols, where, argument);
}

/// L from the expression, or from the caller where the expression does not fix it.
template <class H>
Index resolve_length(const H& h, Index L, const char* where) {
  if (h.length() != any) {
    if (L != any && L != h.length())
      fail(where, "L is " + std::to_string(L) + " but the expression has length " + std::to_string(h.length()));
    return h.length();
  }
  if (L == any) fail(where, "the expression does not fix the length L; pass it as the last argument");
  if (L < 0) fail(where, "L is " + std::to_string(L) + " but must be >= 0");
  return L;
}

template <class H>
void check_channel(const H& h, Index c, const char* where) {
  if (c < 0 || (h.channels() != any && c >= h.channels()))
    fail(where, "channel c = " + std::to_string(c) + " is out of range [0, " +
                    (h.channels() == any ? std::string("D") : std::to_string(h.channels())) + ")");
}

}  // namespace iattn::detail
