// python/src/models_mamba.cpp: iattn.models.mamba and iattn.models.mamba2.
#include "model_binding.hpp"

#include <iattn/models/mamba.hpp>
#include <iattn/models/mamba2.hpp>

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

}  // namespace

void bind_models_mamba(nb::module_& models) {
  bind_model<mamba_spec>(models);
  bind_model<mamba2_spec>(models);
}

}  // namespace iattn::py
