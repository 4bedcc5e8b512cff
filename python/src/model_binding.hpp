// python/src/model_binding.hpp: one Python submodule per model, iattn.models.<name>, from a spec:
//
//   struct spec {
//     static constexpr const char* name, *doc;
//     using config = ...;  template <class T> using weights = ...;
//     static auto config_fields();            // tuple of cfield(name, &config::member)
//     template <class T> static auto weight_fields();  // array of weight_field<weights<T>, T>
//     template <class T> static weights<T> init(const config&, std::uint64_t seed);
//     template <class T> static Matrix<T> forward(const weights<T>&, const Matrix<T>& u);
//     template <class T> static auto decompose(const weights<T>&, const Matrix<T>& u);
//   };
//
// The submodule offers config(**fields), init(seed, dtype, **config), forward(weights, u) and
// decompose(weights, u); weights is a dict of arrays named as the C++ struct's (and the Hugging Face
// state_dict's) fields, carrying its config as the attribute `config` (iattn.Weights) or given by
// the config= argument.
#pragma once

#include "common.hpp"

#include <nanobind/stl/vector.h>

#define IATTN_PY_EXPAND(x) x
#define IATTN_PY_FOR_EACH(m, ...) __VA_OPT__(IATTN_PY_FE_E4(IATTN_PY_FE_H(m, __VA_ARGS__)))
#define IATTN_PY_FE_H(m, a, ...) m(a) __VA_OPT__(IATTN_PY_FE_AGAIN IATTN_PY_FE_P()(m, __VA_ARGS__))
#define IATTN_PY_FE_P() ()
#define IATTN_PY_FE_AGAIN() IATTN_PY_FE_H
#define IATTN_PY_FE_E4(...) IATTN_PY_FE_E3(IATTN_PY_FE_E3(IATTN_PY_FE_E3(IATTN_PY_FE_E3(__VA_ARGS__))))
#define IATTN_PY_FE_E3(...) IATTN_PY_FE_E2(IATTN_PY_FE_E2(IATTN_PY_FE_E2(IATTN_PY_FE_E2(__VA_ARGS__))))
#define IATTN_PY_FE_E2(...) IATTN_PY_FE_E1(IATTN_PY_FE_E1(IATTN_PY_FE_E1(IATTN_PY_FE_E1(__VA_ARGS__))))
#define IATTN_PY_FE_E1(...) __VA_ARGS__

#define IATTN_PY_CFIELD(f) ::iattn::py::cfield(#f, &config::f),
#define IATTN_PY_WFIELD(f) ::iattn::py::weight_field<W, T>{#f, &W::f},
#define IATTN_PY_AFIELD(f) ::iattn::py::weight_field<A, T>{#f, &A::f},
#define IATTN_PY_SFIELD(f) ::iattn::py::cfield(#f, &A::f),
/// template <class T> static auto activation_fields(): the listed Matrix<T> members of activations<T>.
#define IATTN_PY_ACTS(...)                                                                                 \
  template <class T>                                                                                       \
  static auto activation_fields() {                                                                        \
    using A = activations<T>;                                                                              \
    return std::vector<::iattn::py::weight_field<A, T>>{IATTN_PY_FOR_EACH(IATTN_PY_AFIELD, __VA_ARGS__)}; \
  }
/// template <class T> static auto activation_scalars(): the listed non-matrix members of activations<T>.
#define IATTN_PY_ACT_SCALARS(...)                                                  \
  template <class T>                                                                \
  static auto activation_scalars() {                                                \
    using A = activations<T>;                                                       \
    return std::tuple{__VA_OPT__(IATTN_PY_FOR_EACH(IATTN_PY_SFIELD, __VA_ARGS__))}; \
  }
/// static auto config_fields(): the listed members of `config`.
#define IATTN_PY_CONFIG(...) \
  static auto config_fields() { return std::tuple{IATTN_PY_FOR_EACH(IATTN_PY_CFIELD, __VA_ARGS__)}; }
/// template <class T> static auto weight_fields(): the listed Matrix<T> members of weights<T>.
#define IATTN_PY_WEIGHTS(...)                                                        \
  template <class T>                                                                 \
  static auto weight_fields() {                                                      \
    using W = weights<T>;                                                            \
    return std::vector<::iattn::py::weight_field<W, T>>{IATTN_PY_FOR_EACH(IATTN_PY_WFIELD, __VA_ARGS__)}; \
  }

namespace iattn::py {

template <class Spec>
typename Spec::config config_of(nb::handle weights, const std::optional<nb::dict>& config, const char* where) {
  nb::dict c;
  if (config) c = *config;
  else if (nb::hasattr(weights, "config")) c = nb::cast<nb::dict>(weights.attr("config"));
  else
    throw nb::type_error((std::string(where) + ": weights carries no config (an iattn.Weights from init(), or pass config=)").c_str());
  return config_from<typename Spec::config>(c, Spec::config_fields(), Spec::name);
}

/// weights<T> from a mapping of arrays: every field present, no other key, one dtype.
template <class Spec, class T>
typename Spec::template weights<T> weights_from(nb::handle mapping, const typename Spec::config& c, const char* where) {
  typename Spec::template weights<T> w{};
  w.config = c;
  const auto fields = Spec::template weight_fields<T>();
  nb::dict d = nb::cast<nb::dict>(mapping);
  std::string missing, names;
  for (const auto& f : fields) {
    names += (names.empty() ? "" : ", ") + std::string(f.name);
    if (!d.contains(f.name)) {
      missing += (missing.empty() ? "" : ", ") + std::string(f.name);
      continue;
    }
    w.*(f.member) = to_matrix<T>(nb::cast<array_in>(d[f.name]), where, std::string("weights['") + f.name + "']", true);
  }
  if (!missing.empty()) throw std::invalid_argument(std::string(where) + ": weights is missing " + missing + " (the fields are " + names + ")");
  for (auto [k, v] : d) {
    const std::string key = nb::cast<std::string>(k);
    bool known = false;
    for (const auto& f : fields) known = known || key == f.name;
    if (!known) throw std::invalid_argument(std::string(where) + ": weights has an unknown field '" + key + "' (the fields are " + names + ")");
  }
  w.check();
  return w;
}

/// The scalar type of a weights mapping: that of its first field (the others must agree).
template <class Spec>
dtype weights_dtype(nb::handle mapping, const char* where) {
  const auto fields = Spec::template weight_fields<double>();
  nb::dict d = nb::cast<nb::dict>(mapping);
  for (const auto& f : fields)
    if (d.contains(f.name)) return dtype_of(nb::cast<array_in>(d[f.name]), where, std::string("weights['") + f.name + "']");
  throw std::invalid_argument(std::string(where) + ": weights has none of the model's fields");
}

/// The model's activations<T> from a dict: every key a field (an unknown one is a ValueError listing them),
/// absent arrays empty.
template <class Spec, class T>
typename Spec::template activations<T> acts_from(const nb::dict& acts, const std::string& where) {
  typename Spec::template activations<T> a{};
  const auto fields = Spec::template activation_fields<T>();
  const auto scalars = Spec::template activation_scalars<T>();
  std::string names;
  for (const auto& fl : fields) names += (names.empty() ? "" : ", ") + std::string(fl.name);
  std::apply([&](const auto&... fl) { ((names += std::string(", ") + fl.name), ...); }, scalars);
  for (auto [k, v] : acts) {
    const std::string key = nb::cast<std::string>(k);
    bool known = false;
    for (const auto& fl : fields)
      if (key == fl.name) {
        a.*(fl.member) = to_matrix<T>(nb::cast<array_in>(v), where, "acts['" + key + "']", true);
        known = true;
      }
    std::apply([&](const auto&... fl) {
      ((key == fl.name ? (a.*(fl.member) = nb::cast<std::remove_cvref_t<decltype(a.*(fl.member))>>(v), known = true) : false), ...);
    }, scalars);
    if (!known) throw std::invalid_argument(where + ": acts has an unknown field '" + key + "' (the fields are " + names + ")");
  }
  return a;
}

/// The scalar type of an activations dict: that of its first array field, or a ValueError.
template <class Spec>
dtype acts_dtype(const nb::dict& acts, const std::string& where) {
  const auto fields = Spec::template activation_fields<double>();
  for (const auto& fl : fields)
    if (acts.contains(fl.name)) return dtype_of(nb::cast<array_in>(acts[fl.name]), where, std::string("acts['") + fl.name + "']");
  throw std::invalid_argument(where + ": acts has none of the activation fields");
}

/// The activations as a dict named as the C++ struct's fields (arrays and scalars).
template <class Spec, class T>
nb::dict acts_to_dict(const typename Spec::template activations<T>& a) {
  nb::dict out;
  for (const auto& f : Spec::template activation_fields<T>()) out[f.name] = to_numpy<T>(Matrix<T>(a.*(f.member)));
  std::apply([&](const auto&... f) { ((out[f.name] = a.*(f.member)), ...); }, Spec::template activation_scalars<T>());
  return out;
}

/// f(acts) with acts the model's activations<T> read from a dict (T from its arrays), the GIL released
/// while f runs: every key a field (an unknown one is a ValueError listing them), absent arrays empty.
template <class Spec, class F>
auto with_acts(const nb::dict& acts, const std::string& where, F&& f) {
  return on_scalar(acts_dtype<Spec>(acts, where), [&](auto tag) {
    using T = decltype(tag);
    const auto a = acts_from<Spec, T>(acts, where);
    nb::gil_scoped_release release;
    return f(a);
  });
}

/// A paper variant of the attention, from activations: name(acts) -> iattn.Operator.
template <class Spec, class F>
void def_variant(nb::module_& m, const char* name, const char* doc, F f) {
  const std::string where = std::string(Spec::name) + "." + name;
  m.def(name, [where, f](nb::dict acts) { return with_acts<Spec>(acts, where, [&](const auto& a) { return wrap(erase(f(a))); }); },
        nb::arg("acts"), doc);
}

/// f(tag, w) with w the model's weights<T> (tag a T) from a mapping (T from its arrays) and the config that
/// config_of finds: what forward, decompose and activations share.
template <class Spec, class F>
auto with_weights(nb::handle weights, const std::optional<nb::dict>& config, const std::string& where, F&& f) {
  const typename Spec::config c = config_of<Spec>(weights, config, where.c_str());
  return on_scalar(weights_dtype<Spec>(weights, where.c_str()), [&](auto tag) {
    using T = decltype(tag);
    return f(tag, weights_from<Spec, T>(weights, c, where.c_str()));
  });
}

template <class Spec>
void bind_model(nb::module_& models) {
  using C = typename Spec::config;
  nb::module_ m = models.def_submodule(Spec::name, Spec::doc);
  const std::string n = Spec::name;

  m.def("config", [](nb::kwargs kw) { return config_to(config_from<C>(nb::dict(kw), Spec::config_fields(), Spec::name), Spec::config_fields()); },
        "The model's config as a dict: its defaults, overridden by the given fields (an unknown one is a TypeError).");

  m.def(
      "init",
      [n](std::uint64_t seed, const std::string& dt, nb::kwargs kw) {
        const C c = config_from<C>(nb::dict(kw), Spec::config_fields(), Spec::name);
        nb::dict out;
        auto fill = [&](auto tag) {
          using T = decltype(tag);
          auto w = Spec::template init<T>(c, seed);
          for (const auto& f : Spec::template weight_fields<T>()) out[f.name] = to_numpy<T>(Matrix<T>(w.*(f.member)));
        };
        if (dt == "float32") fill(float{});
        else if (dt == "float64") fill(double{});
        else throw nb::type_error((n + ".init: dtype must be 'float32' or 'float64', got '" + dt + "'").c_str());
        nb::object Weights = nb::module_::import_("iattn").attr("Weights");
        return Weights(out, config_to(c, Spec::config_fields()));
      },
      nb::arg("seed") = 0, nb::arg("dtype") = "float64", nb::arg("config"),
      "Seeded random weights with the reference implementation's initialisation, as an iattn.Weights (a dict of\n"
      "arrays named as the state_dict's fields, with .config). config: the model's config fields.");

  m.def(
      "forward",
      [n](nb::handle weights, array_in u, std::optional<nb::dict> config) -> nb::object {
        const std::string where = n + ".forward";
        return with_weights<Spec>(weights, config, where, [&](auto tag, const auto& w) -> nb::object {
          using T = decltype(tag);
          const Matrix<T> x = to_matrix<T>(u, where, "u");
          Matrix<T> y;
          {
            nb::gil_scoped_release release;
            y = Spec::template forward<T>(w, x);
          }
          return to_numpy<T>(std::move(y));
        });
      },
      nb::arg("weights"), nb::arg("u"), nb::arg("config") = nb::none(),
      "The block's own plain recurrent forward (the oracle the decomposition is checked against):\n"
      "u (L, d_model) -> (L, d_model).");

  m.def(
      "decompose",
      [n](nb::handle weights, array_in u, std::optional<nb::dict> config) {
        const std::string where = n + ".decompose";
        return with_weights<Spec>(weights, config, where, [&](auto tag, const auto& w) {
          using T = decltype(tag);
          const Matrix<T> x = to_matrix<T>(u, where, "u");
          nb::gil_scoped_release release;
          return wrap(Spec::template decompose<T>(w, x));
        });
      },
      nb::arg("weights"), nb::arg("u"), nb::arg("config") = nb::none(),
      "The block's exact decomposition on u (L, d_model): an iattn.Decomposition d with\n"
      "d.output() == forward(weights, u) == out_proj(H x + beta).");

  m.def(
      "activations",
      [n](nb::handle weights, array_in u, std::optional<nb::dict> config) -> nb::dict {
        const std::string where = n + ".activations";
        return with_weights<Spec>(weights, config, where, [&](auto tag, const auto& w) {
          using T = decltype(tag);
          const Matrix<T> x = to_matrix<T>(u, where, "u");
          typename Spec::template activations<T> a;
          {
            nb::gil_scoped_release release;
            a = activations(w, x);  // found by argument-dependent lookup in iattn::models
          }
          return acts_to_dict<Spec, T>(a);
        });
      },
      nb::arg("weights"), nb::arg("u"), nb::arg("config") = nb::none(),
      "One forward pass's activations on u (L, d_model), as a dict named as the C++ struct's fields (arrays, and\n"
      "the scalars the decomposition reads): what attention(acts) needs, and what a hook would capture.");

  m.def(
      "attention", [n](nb::dict acts) {
        return with_acts<Spec>(acts, n + ".attention", [](const auto& a) { return wrap(attention(a)); });
      },
      nb::arg("acts"),
      "The exact decomposition from activations (a dict as activations() returns, or built from a hook's\n"
      "tensors): attention(activations(weights, u)) equals decompose(weights, u). Absent arrays are empty\n"
      "(allowed where the C++ struct documents it, e.g. no out_proj: output() is then H x + beta).");
  if constexpr (requires { Spec::variants(m); }) Spec::variants(m);
}

}  // namespace iattn::py

/// A spec's name, types and functions for a model whose C++ helpers follow the naming scheme
/// <prefix>_config, <prefix>_weights<T>, <prefix>_init, <prefix>_forward, <prefix>_decompose.
#define IATTN_PY_SPEC(prefix, documentation)                                                                \
  static constexpr const char* name = #prefix;                                                                \
  static constexpr const char* doc = documentation;                                                          \
  using config = ::iattn::models::prefix##_config;                                                           \
  template <class T>                                                                                         \
  using weights = ::iattn::models::prefix##_weights<T>;                                                      \
  template <class T>                                                                                         \
  using activations = ::iattn::models::prefix##_activations<T>;                                              \
  template <class T>                                                                                         \
  static weights<T> init(const config& c, std::uint64_t seed) {                                              \
    return ::iattn::models::prefix##_init<T>(c, seed);                                                       \
  }                                                                                                          \
  template <class T>                                                                                         \
  static ::iattn::Matrix<T> forward(const weights<T>& w, const ::iattn::Matrix<T>& u) {                      \
    return ::iattn::models::prefix##_forward(w, u);                                                          \
  }                                                                                                          \
  template <class T>                                                                                         \
  static auto decompose(const weights<T>& w, const ::iattn::Matrix<T>& u) {                                  \
    return ::iattn::models::prefix##_decompose(w, u);                                                        \
  }
