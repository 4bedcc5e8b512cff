// python/src/common.hpp: what the binding files share: arrays in and out, the Operator and
// Decomposition classes (a float32 or a float64 expression behind one Python type), and the
// table-driven model bindings.
#pragma once

#include <iattn/any_operator.hpp>
#include <iattn/models/common.hpp>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

namespace iattn::py {

namespace nb = nanobind;
using Index = iattn::Index;

/// Any array-like nanobind reads through DLPack or the buffer protocol (numpy, torch, jax...) on the
/// CPU, C-contiguous: a strided one is copied once into C order on the way in.
using array_in = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

enum class dtype { f32, f64 };

inline const char* dtype_name(dtype d) { return d == dtype::f32 ? "float32" : "float64"; }

/// The scalar type of an input array, or a TypeError naming the argument.
inline dtype dtype_of(const array_in& a, const std::string& where, const std::string& arg) {
  if (a.dtype() == nb::dtype<float>()) return dtype::f32;
  if (a.dtype() == nb::dtype<double>()) return dtype::f64;
  throw nb::type_error((where + ": " + arg + " must be float32 or float64 (convert it with .astype / .to); got another dtype").c_str());
}

/// f(float{}) or f(double{}): the scalar type d names, as a tag for f's template parameter.
template <class F>
decltype(auto) on_scalar(dtype d, F&& f) {
  return d == dtype::f32 ? f(float{}) : f(double{});
}

inline std::string shape_string(const array_in& a) {
  std::string s = "(";
  for (std::size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

/// A 2-D (rows, cols) or 1-D (treated as (1, n)) array as a Matrix<T>; one copy into the owned,
/// aligned storage the operators keep (as a C++ lvalue operand is copied once).
template <class T>
Matrix<T> to_matrix(const array_in& a, const std::string& where, const std::string& arg, bool allow_1d = false) {
  if (a.dtype() != nb::dtype<T>())
    throw nb::type_error((where + ": " + arg + " is " + (a.dtype() == nb::dtype<float>() ? "float32" : a.dtype() == nb::dtype<double>() ? "float64" : "not a float array") +
                          " but the other operands are " + dtype_name(std::is_same_v<T, float> ? dtype::f32 : dtype::f64) +
                          "; convert it (an expression has one scalar type)").c_str());
  Index r = 0, c = 0;
  if (a.ndim() == 2) {
    r = Index(a.shape(0));
    c = Index(a.shape(1));
  } else if (a.ndim() == 1 && allow_1d) {
    r = 1;
    c = Index(a.shape(0));
  } else {
    throw std::invalid_argument(where + ": " + arg + " has shape " + shape_string(a) + " but expected a 2-D array" +
                                (allow_1d ? " (or a 1-D one, read as one row)" : ""));
  }
  Matrix<T> m(r, c);
  const T* src = static_cast<const T*>(a.data());
  std::copy(src, src + r * c, m.data());
  return m;
}

/// A Matrix handed to Python without a copy: numpy owns it through a capsule.
template <class T>
nb::object to_numpy(Matrix<T>&& m) {
  auto* p = new Matrix<T>(std::move(m));
  nb::capsule owner(p, [](void* v) noexcept { delete static_cast<Matrix<T>*>(v); });
  const std::size_t shape[2] = {std::size_t(p->rows()), std::size_t(p->cols())};
  return nb::cast(nb::ndarray<nb::numpy, T, nb::ndim<2>>(p->data(), 2, shape, owner));
}
template <class T>
nb::object to_numpy(Tensor3<T>&& m) {
  auto* p = new Tensor3<T>(std::move(m));
  nb::capsule owner(p, [](void* v) noexcept { delete static_cast<Tensor3<T>*>(v); });
  const std::size_t shape[3] = {std::size_t(p->dims[0]), std::size_t(p->dims[1]), std::size_t(p->dims[2])};
  return nb::cast(nb::ndarray<nb::numpy, T, nb::ndim<3>>(p->data(), 3, shape, owner));
}

/// An operator of either scalar type: the Python class `iattn.Operator`.
struct Operator {
  std::variant<AnyOperator<float>, AnyOperator<double>> op;

  dtype type() const { return op.index() == 0 ? dtype::f32 : dtype::f64; }
  template <class T>
  const AnyOperator<T>& as() const { return std::get<AnyOperator<T>>(op); }
  /// f(AnyOperator<T>&) with T the operator's scalar type.
  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit([&](const auto& a) -> decltype(auto) { return f(a); }, op);
  }
};

template <class T>
Operator wrap(AnyOperator<T> a) { return Operator{std::move(a)}; }

/// A block's exact decomposition, output = out_proj(H x + beta): the Python class `iattn.Decomposition`.
struct Decomposition {
  Operator H;
  std::variant<models::decomposition<float, AnyOperator<float>>, models::decomposition<double, AnyOperator<double>>> d;
};

template <class T, class Op>
Decomposition wrap(models::decomposition<T, Op>&& d) {
  AnyOperator<T> H = erase(std::move(d.H));
  models::decomposition<T, AnyOperator<T>> e{std::move(d.x), H, std::move(d.beta), std::move(d.out_weight), std::move(d.out_bias)};
  return Decomposition{Operator{H}, std::move(e)};
}

// ---- models: configs and weights from Python by a table of fields ----------------------------------

/// A config field: its Python name and the member it sets (Index, double or bool).
template <class C, class M>
struct config_field {
  const char* name;
  M C::*member;
};
template <class C, class M>
config_field<C, M> cfield(const char* n, M C::*m) { return {n, m}; }

/// A weights field (a Matrix<T> member) and whether it may be absent (an empty matrix).
template <class W, class T>
struct weight_field {
  const char* name;
  Matrix<T> W::*member;
};

/// The config from a dict (or any mapping) of its fields; unknown keys are a TypeError listing them.
template <class C, class Fields>
C config_from(const nb::dict& kw, const Fields& fields, const char* model) {
  C c{};
  std::vector<std::string> known;
  std::apply([&](const auto&... f) { (known.push_back(f.name), ...); }, fields);
  for (auto [k, v] : kw) {
    const std::string key = nb::cast<std::string>(k);
    bool found = false;
    std::apply([&](const auto&... f) {
      ((key == f.name ? (c.*(f.member) = nb::cast<std::remove_cvref_t<decltype(c.*(f.member))>>(v), found = true) : false), ...);
    }, fields);
    if (!found) {
      std::string list;
      for (const auto& n : known) list += (list.empty() ? "" : ", ") + n;
      throw nb::type_error((std::string(model) + ": unknown config field '" + key + "'; the fields are " + list).c_str());
    }
  }
  return c;
}

template <class C, class Fields>
nb::dict config_to(const C& c, const Fields& fields) {
  nb::dict d;
  std::apply([&](const auto&... f) { ((d[f.name] = c.*(f.member)), ...); }, fields);
  return d;
}

}  // namespace iattn::py
