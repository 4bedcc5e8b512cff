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

}  // namespace iattn::detail
