// python/src/models_mamba.cpp: iattn.models.mamba, iattn.models.mamba2 and iattn.models.vision_mamba.
#include "model_binding.hpp"

#include <iattn/models/mamba.hpp>
#include <iattn/models/mamba2.hpp>
#include <iattn/models/vision_mamba.hpp>

namespace iattn::py {
namespace {

struct mamba_spec {
  IATTN_PY_SPEC(mamba, "Mamba-1 (mamba_ssm `Mamba`, transformers `MambaMixer`): the selective scan as implicit attention.")
  IATTN_PY_CONFIG(d_model, d_state, d_conv, expand, dt_rank)
  IATTN_PY_WEIGHTS(in_proj_weight, conv1d_weight, conv1d_bias, x_proj_weight, dt_proj_weight, dt_proj_bias, A_log, D, out_proj_weight)
  static void variants(nb::module_& m) {
    def_variant<mamba_spec>(m, "s6_attention", "Ali et al.'s hidden attention of S6 (eq. 12): S(delta (x) A, B, C) diag(delta), acting on SiLU(p).",
                            [](const auto& a) { return models::s6_attention(a); });
    def_variant<mamba_spec>(m, "holistic_attention",
                            "Zimerman et al.'s eq. 9: diag(SiLU z) S diag(delta) diag(sigmoid p) M, acting on x (the D skip and conv bias dropped).",
                            [](const auto& a) { return models::holistic_attention(a); });
  }
  IATTN_PY_ACTS(x, z, delta, A, B, C, D, conv1d_weight, conv1d_bias, out_proj_weight)
  IATTN_PY_ACT_SCALARS()
};

struct mamba2_spec {
  IATTN_PY_SPEC(mamba2, "Mamba-2 (mamba_ssm `Mamba2`, transformers `Mamba2Mixer`): the SSD scan, its gated RMS norm bound at u.")
  IATTN_PY_CONFIG(d_model, d_state, d_conv, expand, headdim, ngroups, eps, dt_min)
  IATTN_PY_WEIGHTS(in_proj_weight, conv1d_weight, conv1d_bias, dt_bias, A_log, D, norm_weight, out_proj_weight)
  static void variants(nb::module_& m) {
    def_variant<mamba2_spec>(m, "paper_attention", "Zimerman et al.'s eq. 11: the D skip and the bias term dropped, the norm bound as in attention().",
                             [](const auto& a) { return models::mamba2_paper_attention(a); });
  }
  IATTN_PY_ACTS(x, z, dt, A, B, C, D, conv1d_weight, conv1d_bias, norm_weight, out_proj_weight)
  IATTN_PY_ACT_SCALARS(ngroups, eps)
};

// ---- vision_mamba: its weights and activations nest two Mamba structs, so it is bound by hand ----------
//
// Weights: one flat dict named as Vim's `Mamba` (bimamba v2) state_dict, '.' written '_': the forward
// branch's mamba_ssm names (in_proj_weight, conv1d_weight, ..., out_proj_weight, shared by both branches)
// and the backward branch's twins (conv1d_b_weight, conv1d_b_bias, x_proj_b_weight, dt_proj_b_weight,
// dt_proj_b_bias, A_b_log, D_b). Config: mamba's fields and if_devide_out, flat.
// Activations: {"fwd": <a mamba activations dict>, "bwd": <one, in reversed token order>,
// "out_proj_weight": (d_model, d_inner) or absent, "if_devide_out": bool}; each branch's dict is what
// iattn.models.mamba.attention takes.

/// The flat Python view of vision_mamba_config (mamba's sizes and if_devide_out), defaults from C++.
struct vision_mamba_flat_config {
  Index d_model = models::vision_mamba_config{}.mamba.d_model;
  Index d_state = models::vision_mamba_config{}.mamba.d_state;
  Index d_conv = models::vision_mamba_config{}.mamba.d_conv;
  Index expand = models::vision_mamba_config{}.mamba.expand;
  Index dt_rank = models::vision_mamba_config{}.mamba.dt_rank;
  bool if_devide_out = models::vision_mamba_config{}.if_devide_out;

  models::vision_mamba_config nested() const {
    models::vision_mamba_config c;
    c.mamba = {.d_model = d_model, .d_state = d_state, .d_conv = d_conv, .expand = expand, .dt_rank = dt_rank};
    c.if_devide_out = if_devide_out;
    return c;
  }
};

struct vision_mamba_spec {
  static constexpr const char* name = "vision_mamba";
  using config = vision_mamba_flat_config;
  IATTN_PY_CONFIG(d_model, d_state, d_conv, expand, dt_rank, if_devide_out)
};

/// One weights field: its Vim name and where it lives in the nested C++ struct.
template <class T>
struct vim_field {
  const char* name;
  Matrix<T>& (*get)(models::vision_mamba_weights<T>&);
};

#define IATTN_PY_VIM(n, path) \
  vim_field<T> { n, [](models::vision_mamba_weights<T>& w) -> Matrix<T>& { return w.path; } }

template <class T>
std::vector<vim_field<T>> vim_fields() {
  return {IATTN_PY_VIM("in_proj_weight", fwd.in_proj_weight),     IATTN_PY_VIM("conv1d_weight", fwd.conv1d_weight),
          IATTN_PY_VIM("conv1d_bias", fwd.conv1d_bias),           IATTN_PY_VIM("x_proj_weight", fwd.x_proj_weight),
          IATTN_PY_VIM("dt_proj_weight", fwd.dt_proj_weight),     IATTN_PY_VIM("dt_proj_bias", fwd.dt_proj_bias),
          IATTN_PY_VIM("A_log", fwd.A_log),                       IATTN_PY_VIM("D", fwd.D),
          IATTN_PY_VIM("out_proj_weight", fwd.out_proj_weight),   IATTN_PY_VIM("conv1d_b_weight", conv1d_b_weight),
          IATTN_PY_VIM("conv1d_b_bias", conv1d_b_bias),           IATTN_PY_VIM("x_proj_b_weight", x_proj_b_weight),
          IATTN_PY_VIM("dt_proj_b_weight", dt_proj_b_weight),     IATTN_PY_VIM("dt_proj_b_bias", dt_proj_b_bias),
          IATTN_PY_VIM("A_b_log", A_b_log),                       IATTN_PY_VIM("D_b", D_b)};
}
#undef IATTN_PY_VIM

/// f(tag, w) with w the vision_mamba_weights<T> of a flat Vim-named dict (every field present, no other
/// key, one dtype; T from its first field) and the config config_of finds.
template <class F>
auto with_vim_weights(nb::handle weights, const std::optional<nb::dict>& config, const std::string& where, F&& f) {
  const models::vision_mamba_config c = config_of<vision_mamba_spec>(weights, config, where.c_str()).nested();
  nb::dict d = nb::cast<nb::dict>(weights);
  std::string names;
  for (const auto& fl : vim_fields<double>()) names += (names.empty() ? "" : ", ") + std::string(fl.name);
  for (auto [k, v] : d) {
    const std::string key = nb::cast<std::string>(k);
    bool known = false;
    for (const auto& fl : vim_fields<double>()) known = known || key == fl.name;
    if (!known) throw std::invalid_argument(where + ": weights has an unknown field '" + key + "' (the fields are " + names + ")");
  }
  std::string missing;
  for (const auto& fl : vim_fields<double>())
    if (!d.contains(fl.name)) missing += (missing.empty() ? "" : ", ") + std::string(fl.name);
  if (!missing.empty()) throw std::invalid_argument(where + ": weights is missing " + missing + " (the fields are " + names + ")");
  const auto first = vim_fields<double>().front().name;
  return on_scalar(dtype_of(nb::cast<array_in>(d[first]), where, std::string("weights['") + first + "']"), [&](auto tag) {
    using T = decltype(tag);
    models::vision_mamba_weights<T> w{};
    w.config = c;
    w.fwd.config = c.mamba;
    for (const auto& fl : vim_fields<T>()) fl.get(w) = to_matrix<T>(nb::cast<array_in>(d[fl.name]), where, std::string("weights['") + fl.name + "']", true);
    w.check();
    return f(tag, w);
  });
}

/// vision_mamba_activations<T> from {"fwd": dict, "bwd": dict, "out_proj_weight": array, "if_devide_out": bool}.
template <class T>
models::vision_mamba_activations<T> vim_acts_from(const nb::dict& acts, const std::string& where) {
  models::vision_mamba_activations<T> a{};
  for (auto [k, v] : acts) {
    const std::string key = nb::cast<std::string>(k);
    if (key == "fwd" || key == "bwd") {
      if (!nb::isinstance<nb::dict>(v))
        throw nb::type_error((where + ": acts['" + key + "'] must be a dict of the branch's Mamba activations (as iattn.models.mamba.activations returns)").c_str());
      (key == "fwd" ? a.fwd : a.bwd) = acts_from<mamba_spec, T>(nb::cast<nb::dict>(v), where + " (acts['" + key + "'])");
    } else if (key == "out_proj_weight") {
      a.out_proj_weight = to_matrix<T>(nb::cast<array_in>(v), where, "acts['out_proj_weight']");
    } else if (key == "if_devide_out") {
      a.if_devide_out = nb::cast<bool>(v);
    } else {
      throw std::invalid_argument(where + ": acts has an unknown field '" + key + "' (the fields are fwd, bwd, out_proj_weight, if_devide_out)");
    }
  }
  for (const char* branch : {"fwd", "bwd"})
    if (!acts.contains(branch)) throw std::invalid_argument(where + ": acts is missing '" + branch + "' (the fields are fwd, bwd, out_proj_weight, if_devide_out)");
  return a;
}

void bind_vision_mamba(nb::module_& models) {
  nb::module_ m = models.def_submodule(
      "vision_mamba",
      "Vision Mamba's bidirectional block (Vim `Mamba`, bimamba v2): a forward and a backward selective scan sharing\n"
      "in_proj and out_proj; H = s (H_fwd + flip(H_bwd)) is not causal. Weights are named as Vim's state_dict\n"
      "(the backward branch's fields end in _b: conv1d_b_weight, x_proj_b_weight, A_b_log, D_b, ...).");
  using C = vision_mamba_flat_config;
  const auto fields = vision_mamba_spec::config_fields();
  m.def("config", [fields](nb::kwargs kw) { return config_to(config_from<C>(nb::dict(kw), fields, "vision_mamba"), fields); },
        "The model's config as a dict (mamba's sizes and if_devide_out): its defaults, overridden by the given fields\n"
        "(an unknown one is a TypeError).");
  m.def(
      "init",
      [fields](std::uint64_t seed, const std::string& dt, nb::kwargs kw) {
        const C c = config_from<C>(nb::dict(kw), fields, "vision_mamba");
        nb::dict out;
        auto fill = [&](auto tag) {
          using T = decltype(tag);
          auto w = models::vision_mamba_init<T>(c.nested(), seed);
          for (const auto& f : vim_fields<T>()) out[f.name] = to_numpy<T>(Matrix<T>(f.get(w)));
        };
        if (dt == "float32") fill(float{});
        else if (dt == "float64") fill(double{});
        else throw nb::type_error(("vision_mamba.init: dtype must be 'float32' or 'float64', got '" + dt + "'").c_str());
        nb::object Weights = nb::module_::import_("iattn").attr("Weights");
        return Weights(out, config_to(c, fields));
      },
      nb::arg("seed") = 0, nb::arg("dtype") = "float64", nb::arg("config"),
      "Seeded random weights (both branches as mamba_ssm initialises them, drawn independently), as an iattn.Weights\n"
      "named as Vim's state_dict. config: the model's config fields.");
  m.def(
      "forward",
      [](nb::handle weights, array_in u, std::optional<nb::dict> config) -> nb::object {
        const std::string where = "vision_mamba.forward";
        return with_vim_weights(weights, config, where, [&](auto tag, const auto& w) -> nb::object {
          using T = decltype(tag);
          const Matrix<T> x = to_matrix<T>(u, where, "u");
          Matrix<T> y;
          {
            nb::gil_scoped_release release;
            y = models::vision_mamba_forward(w, x);
          }
          return to_numpy<T>(std::move(y));
        });
      },
      nb::arg("weights"), nb::arg("u"), nb::arg("config") = nb::none(),
      "The block's own forward, two plain recurrent scans (one over the reversed tokens): u (L, d_model) -> (L, d_model).");
  m.def(
      "decompose",
      [](nb::handle weights, array_in u, std::optional<nb::dict> config) {
        const std::string where = "vision_mamba.decompose";
        return with_vim_weights(weights, config, where, [&](auto tag, const auto& w) {
          using T = decltype(tag);
          const Matrix<T> x = to_matrix<T>(u, where, "u");
          nb::gil_scoped_release release;
          return wrap(models::vision_mamba_decompose(w, x));
        });
      },
      nb::arg("weights"), nb::arg("u"), nb::arg("config") = nb::none(),
      "The exact decomposition on u (L, d_model): d.output() == forward(weights, u) == out_proj(H x + beta), H not causal.");
  m.def(
      "activations",
      [](nb::handle weights, array_in u, std::optional<nb::dict> config) -> nb::dict {
        const std::string where = "vision_mamba.activations";
        return with_vim_weights(weights, config, where, [&](auto tag, const auto& w) {
          using T = decltype(tag);
          const Matrix<T> x = to_matrix<T>(u, where, "u");
          models::vision_mamba_activations<T> a;
          {
            nb::gil_scoped_release release;
            a = models::activations(w, x);
          }
          nb::dict out;
          out["fwd"] = acts_to_dict<mamba_spec, T>(a.fwd);
          out["bwd"] = acts_to_dict<mamba_spec, T>(a.bwd);
          out["out_proj_weight"] = to_numpy<T>(Matrix<T>(a.out_proj_weight));
          out["if_devide_out"] = a.if_devide_out;
          return out;
        });
      },
      nb::arg("weights"), nb::arg("u"), nb::arg("config") = nb::none(),
      "One forward pass's activations: {'fwd': the forward scan's Mamba activations dict, 'bwd': the backward scan's\n"
      "(on the reversed tokens, so in reversed order: bwd['x'] is fwd['x'] upside down), 'out_proj_weight',\n"
      "'if_devide_out'}; the branch dicts carry no out_proj_weight (it is shared).");
  m.def(
      "attention",
      [](nb::dict acts) {
        const std::string where = "vision_mamba.attention";
        if (!acts.contains("fwd") || !nb::isinstance<nb::dict>(acts["fwd"]))
          throw std::invalid_argument(where + ": acts['fwd'] must be the forward branch's Mamba activations dict");
        return on_scalar(acts_dtype<mamba_spec>(nb::cast<nb::dict>(acts["fwd"]), where + " (acts['fwd'])"), [&](auto tag) {
          using T = decltype(tag);
          const auto a = vim_acts_from<T>(acts, where);
          nb::gil_scoped_release release;
          return wrap(models::attention(a));
        });
      },
      nb::arg("acts"),
      "The exact decomposition from activations (a dict as activations() returns): equals decompose(weights, u).\n"
      "Without out_proj_weight, output() is s (y_fwd + J y_bwd), the inner output.");
}

}  // namespace

void bind_models_mamba(nb::module_& models) {
  bind_model<mamba_spec>(models);
  bind_model<mamba2_spec>(models);
  bind_vision_mamba(models);
}

}  // namespace iattn::py
