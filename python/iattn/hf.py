"""iattn.hf: the implicit attention of a Hugging Face transformers model, layer by layer.

    import iattn.hf
    ex = iattn.hf.explain(model, input_ids=ids)      # a transformers model, e.g. MambaForCausalLM
    ex.maps()                   # per layer (batch, heads, L, L): bertviz's head_view layout
    ex.rollout(), ex.attribution(query=-1)           # over the whole stack
    ex.max_relative_error()     # each mixer's hooked output against out_proj(H x + beta)
    ex.save("out/")             # .npy maps, PNG heatmaps and an index.html

Forward hooks capture each mixer's input; the architecture's adapter reads the mixer's parameters by
their Hugging Face names and builds iattn's decomposition of that layer; softmax attention layers of
hybrid models contribute their exact attention probabilities (the model runs with eager attention).
See docs/python.md for the supported model types and the exactness each reaches.
"""
from __future__ import annotations

import html
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import Decomposition, Weights, models
from . import _iattn as _ops
from . import explain as _explain

__all__ = ["Explanation", "LayerMap", "explain", "supported_model_types"]


# ---- the adapters: one per mixer kind ---------------------------------------------------------------

def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _np(t) -> np.ndarray:
    """A torch tensor as a numpy array without a copy where the dtype allows (detached, on the CPU)."""
    return t.detach().cpu().numpy()


def _row(t) -> np.ndarray:
    return _np(t).reshape(1, -1)


def _dtype_name(t) -> str:
    name = str(t.dtype).replace("torch.", "")
    if name not in ("float32", "float64"):
        raise TypeError(f"iattn.hf: the model's parameters are {name}; call model.float() or model.double() first "
                        "(iattn evaluates in float32 or float64)")
    return name


def _no_bias(module, names, what):
    for n in names:
        lin = getattr(module, n, None)
        if lin is not None and getattr(lin, "bias", None) is not None:
            raise ValueError(f"iattn.hf: {what}.{n} has a bias; the {what} decomposition supports bias-free projections "
                             "only (config use_bias=False, the default)")


def _mamba_weights(mixer) -> Weights:
    _no_bias(mixer, ["in_proj", "out_proj"], "mamba mixer")
    di, N = mixer.A_log.shape
    K = mixer.conv1d.weight.shape[-1]
    dm = mixer.in_proj.weight.shape[1]
    R = mixer.dt_proj.weight.shape[1]
    w = {
        "in_proj_weight": _np(mixer.in_proj.weight),
        "conv1d_weight": _np(mixer.conv1d.weight).reshape(di, K),
        "conv1d_bias": _row(mixer.conv1d.bias) if mixer.conv1d.bias is not None else np.zeros((1, di), _np(mixer.A_log).dtype),
        "x_proj_weight": _np(mixer.x_proj.weight),
        "dt_proj_weight": _np(mixer.dt_proj.weight),
        "dt_proj_bias": _row(mixer.dt_proj.bias),
        "A_log": _np(mixer.A_log),
        "D": _row(mixer.D),
        "out_proj_weight": _np(mixer.out_proj.weight),
    }
    return Weights(w, dict(d_model=dm, d_state=N, d_conv=K, expand=di // dm, dt_rank=R))


def _dt_floor(mixer) -> float:
    """The lower clamp of a Mamba-2 mixer's dt (time_step_limit; nemotron_h and zamba2 hard-code
    (time_step_min, inf)); an upper clamp is refused."""
    lo, hi = (float(v) for v in getattr(mixer, "time_step_limit", (0.0, float("inf"))))
    if hi != float("inf"):
        raise ValueError(f"iattn.hf: the mamba2 mixer clamps dt to ({lo}, {hi}); an upper clamp is not supported")
    return lo


def _mamba2_weights(mixer) -> Weights:
    _no_bias(mixer, ["in_proj", "out_proj"], "mamba2 mixer")
    H = mixer.A_log.shape[0]
    dm = mixer.in_proj.weight.shape[1]
    di = mixer.out_proj.weight.shape[1]
    K = mixer.conv1d.weight.shape[-1]
    G = mixer.n_groups
    N = mixer.ssm_state_size
    conv_dim = di + 2 * G * N
    if not hasattr(mixer.norm, "weight"):
        raise ValueError("iattn.hf: the mamba2 mixer has no gated RMS norm; not supported")
    w = {
        "in_proj_weight": _np(mixer.in_proj.weight),
        "conv1d_weight": _np(mixer.conv1d.weight).reshape(conv_dim, K),
        "conv1d_bias": _row(mixer.conv1d.bias),
        "dt_bias": _row(mixer.dt_bias),
        "A_log": _row(mixer.A_log),
        "D": _row(mixer.D),
        "norm_weight": _row(mixer.norm.weight),
        "out_proj_weight": _np(mixer.out_proj.weight),
    }
    eps = float(getattr(mixer.norm, "variance_epsilon", getattr(mixer, "layer_norm_epsilon", 1e-5)))
    return Weights(w, dict(d_model=dm, d_state=N, d_conv=K, expand=di // dm, headdim=di // H, ngroups=G, eps=eps,
                           dt_min=_dt_floor(mixer)))


def _rwkv_weights(att) -> Weights:
    Hd = att.key.weight.shape[1]
    A = att.key.weight.shape[0]
    w = {
        "time_decay": _row(att.time_decay),
        "time_first": _row(att.time_first),
        "time_mix_key": _row(att.time_mix_key),
        "time_mix_value": _row(att.time_mix_value),
        "time_mix_receptance": _row(att.time_mix_receptance),
        "key_weight": _np(att.key.weight),
        "value_weight": _np(att.value.weight),
        "receptance_weight": _np(att.receptance.weight),
        "output_weight": _np(att.output.weight),
    }
    return Weights(w, dict(hidden_size=Hd, attention_hidden_size=A, layer_id=int(getattr(att, "layer_id", 0)),
                           num_hidden_layers=int(getattr(att, "layer_id", 0)) + 1))


def _griffin_weights(block) -> Weights:
    D = block.lru_width
    K = block.conv_1d.weight.shape[-1]
    lru = block.rg_lru
    H = lru.num_attention_heads
    bw = D // H
    w = {
        "linear_y_weight": _np(block.linear_y.weight), "linear_y_bias": _row(block.linear_y.bias),
        "linear_x_weight": _np(block.linear_x.weight), "linear_x_bias": _row(block.linear_x.bias),
        "linear_out_weight": _np(block.linear_out.weight), "linear_out_bias": _row(block.linear_out.bias),
        "conv_1d_w": np.ascontiguousarray(_np(block.conv_1d.weight).reshape(D, K).T),
        "conv_1d_b": _row(block.conv_1d.bias),
        "rg_lru_a_param": _row(lru.recurrent_param),
        "rg_lru_input_gate_w": _np(lru.input_gate_weight).reshape(D, bw),
        "rg_lru_input_gate_b": _np(lru.input_gate_bias).reshape(1, D),
        "rg_lru_a_gate_w": _np(lru.recurrent_gate_weight).reshape(D, bw),
        "rg_lru_a_gate_b": _np(lru.recurrent_gate_bias).reshape(1, D),
    }
    return Weights(w, dict(width=block.hidden_size, lru_width=D, num_heads=H))


def _decompose_by_weights(kind, weights_of):
    """A decomposer that maps the module's parameters onto iattn weights and decomposes the hooked input."""
    def run(module, u):
        w = weights_of(module)
        return [getattr(models, kind).decompose(w, np.ascontiguousarray(ub)) for ub in u]
    return run


def _decompose_mamba2(module, u):
    """Mamba-2 by its weights (a dt floor, nemotron_h's and zamba2's time_step_min, is the config's dt_min)."""
    w = _mamba2_weights(module)
    return [models.mamba2.decompose(w, np.ascontiguousarray(ub)) for ub in u]


def _decompose_normed_mamba(module, u):
    """Mamba-1 mixers that normalise dt_in, B and C after x_proj (falcon_mamba: weightless RMS norms, jamba:
    weighted ones): the activations computed with the module's own layers, then iattn's attention(acts)."""
    import torch
    import torch.nn.functional as F

    _no_bias(module, ["in_proj", "out_proj"], "mamba mixer")
    di, N = module.A_log.shape
    R = module.dt_proj.weight.shape[1]
    K = module.conv1d.weight.shape[-1]
    out = []
    with torch.no_grad():
        for ub in u:
            x_in = torch.from_numpy(np.ascontiguousarray(ub)).unsqueeze(0)
            xz = module.in_proj(x_in)[0]
            x, z = xz[:, :di], xz[:, di:]
            p = module.conv1d(x.T.unsqueeze(0))[0, :, : x.shape[0]].T
            a = F.silu(p)
            dt_in, B, C = torch.split(module.x_proj(a), [R, N, N], dim=-1)
            dt_in, B, C = module.dt_layernorm(dt_in), module.b_layernorm(B), module.c_layernorm(C)
            delta = F.softplus(dt_in @ module.dt_proj.weight.T + module.dt_proj.bias)
            acts = {
                "x": _np(x), "z": _np(z), "delta": _np(delta), "A": _np(-torch.exp(module.A_log)),
                "B": _np(B), "C": _np(C), "D": _row(module.D),
                "conv1d_weight": _np(module.conv1d.weight).reshape(di, K),
                "out_proj_weight": _np(module.out_proj.weight),
            }
            if module.conv1d.bias is not None:
                acts["conv1d_bias"] = _row(module.conv1d.bias)
            out.append(models.mamba.attention({k: np.ascontiguousarray(v) for k, v in acts.items()}))
    return out


def _qwen3_next_weights(m) -> Weights:
    K = m.conv1d.weight.shape[-1]
    if m.conv1d.bias is not None:
        raise ValueError("iattn.hf: the qwen3_next mixer's conv1d has a bias; not supported")
    w = {
        "in_proj_qkvz_weight": _np(m.in_proj_qkvz.weight),
        "in_proj_ba_weight": _np(m.in_proj_ba.weight),
        "conv1d_weight": _np(m.conv1d.weight).reshape(m.conv_dim, K),
        "dt_bias": _row(m.dt_bias),
        "A_log": _row(m.A_log),
        "norm_weight": _row(m.norm.weight),
        "out_proj_weight": _np(m.out_proj.weight),
    }
    return Weights(w, dict(hidden_size=m.hidden_size, linear_num_value_heads=m.num_v_heads, linear_num_key_heads=m.num_k_heads,
                           linear_key_head_dim=m.head_k_dim, linear_value_head_dim=m.head_v_dim, linear_conv_kernel_dim=K,
                           rms_norm_eps=float(m.layer_norm_epsilon)))


def _kimi_linear_weights(m) -> Weights:
    """Kimi Delta Attention (transformers `KimiLinearDeltaAttention`) onto iattn.models.kimi_linear's weights."""
    if m.conv1d.bias is not None:
        raise ValueError("iattn.hf: the kimi_linear mixer's conv1d has a bias; not supported")
    if m.activation not in ("silu", "swish"):
        raise ValueError(f"iattn.hf: the kimi_linear mixer's activation is {m.activation!r}; only silu is supported")
    K = m.conv1d.weight.shape[-1]
    dtype = _np(m.q_proj.weight).dtype  # dt_bias is kept in float32 by transformers (_keep_in_fp32_modules_strict)
    fg = m.forget_gate
    w = {
        "q_proj_weight": _np(m.q_proj.weight), "k_proj_weight": _np(m.k_proj.weight), "v_proj_weight": _np(m.v_proj.weight),
        "conv1d_weight": _np(m.conv1d.weight).reshape(m.conv_dim, K),
        "forget_gate_f_a_proj_weight": _np(fg.f_a_proj.weight), "forget_gate_f_b_proj_weight": _np(fg.f_b_proj.weight),
        "forget_gate_dt_bias": _row(fg.dt_bias), "forget_gate_A_log": _np(fg.A_log).reshape(1, -1),
        "b_proj_weight": _np(m.b_proj.weight), "g_a_proj_weight": _np(m.g_a_proj.weight), "g_b_proj_weight": _np(m.g_b_proj.weight),
        "o_norm_weight": _row(m.o_norm.weight), "o_proj_weight": _np(m.o_proj.weight),
    }
    w = {k: np.ascontiguousarray(v, dtype=dtype) for k, v in w.items()}
    return Weights(w, dict(hidden_size=m.hidden_size, linear_num_heads=m.num_heads, linear_head_dim=m.head_dim,
                           linear_conv_kernel_dim=K, rms_norm_eps=float(m.o_norm.variance_epsilon)))


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _silu(v):
    return v * _sigmoid(v)


def _decompose_falcon_h1_mamba(module, u):
    """Falcon-H1's Mamba-2 mixer: the activations computed with the module's own layers (ssm_in_multiplier on the
    input and mup_vector on in_proj's output, as the module applies them), then
      mamba_rms_norm=True, norm_before_gate=False: iattn.models.mamba2.attention(acts) (the same mixer);
      mamba_rms_norm=False: H = diag(SiLU z) (S diag(dt) + diag(D)) diag(sigmoid p) M (no norm);
      mamba_rms_norm=True, norm_before_gate=True: H = diag(SiLU z) N (S diag(dt) + diag(D)) diag(sigmoid p) M, N the
      gated RMS norm's per-token scale bound to its input (the scan output), as Mamba-2's norm is bound;
    beta likewise from the conv bias. An out_proj bias (projectors_bias) is the decomposition's out_bias."""
    import torch
    import torch.nn.functional as F

    _no_bias(module, ["in_proj"], "falcon_h1 mamba mixer")
    if module.activation not in ("silu", "swish"):
        raise ValueError(f"iattn.hf: the falcon_h1 mamba mixer's activation is {module.activation!r}; only silu is supported")
    lo = _dt_floor(module)
    H, P, G, N = module.num_heads, module.head_dim, module.n_groups, module.ssm_state_size
    di, K, cd = module.intermediate_size, module.conv_kernel_size, module.conv_dim
    rms = bool(module.mamba_rms_norm)
    before = rms and bool(getattr(module.norm, "norm_before_gate", False))
    out_w = _np(module.out_proj.weight)
    out_b = _row(module.out_proj.bias) if module.out_proj.bias is not None else None
    out = []
    with torch.no_grad():
        for ub in u:
            h = torch.from_numpy(np.ascontiguousarray(ub)).unsqueeze(0) * module.ssm_in_multiplier
            proj = (module.in_proj(h) * module.mup_vector)[0]
            L = proj.shape[0]
            z, xBC, dt_in = torch.split(proj, [di, cd, H], dim=-1)
            p = F.conv1d(xBC.T.unsqueeze(0), module.conv1d.weight, module.conv1d.bias, padding=K - 1, groups=cd)[0, :, :L].T
            act = F.silu(p)
            dt = torch.clamp(F.softplus(dt_in + module.dt_bias), min=lo)
            x, z, dt, p, act = (np.ascontiguousarray(_np(t)) for t in (xBC[:, :di], z, dt, p, act))
            B, C = np.ascontiguousarray(act[:, di:di + G * N]), np.ascontiguousarray(act[:, di + G * N:])
            A = -np.exp(_np(module.A_log))
            conv_w = _np(module.conv1d.weight).reshape(cd, K)
            conv_b = _np(module.conv1d.bias).reshape(1, cd) if module.conv1d.bias is not None else None
            if rms and not before:
                acts = {"x": x, "z": z, "dt": dt, "A": A.reshape(1, H), "B": B, "C": C, "D": _row(module.D),
                        "conv1d_weight": conv_w, "norm_weight": _row(module.norm.weight), "out_proj_weight": out_w,
                        "ngroups": G, "eps": float(module.norm.variance_epsilon)}
                if conv_b is not None:
                    acts["conv1d_bias"] = conv_b
                d = models.mamba2.attention({k: (np.ascontiguousarray(v) if isinstance(v, np.ndarray) else v) for k, v in acts.items()})
                out.append(d if out_b is None else Decomposition(d.H, d.x, d.beta, out_w, out_b))
                continue
            # the scan S (per-head decay dt A, B/C groups), its dt and D skip per channel, the conv and its SiLU slope
            S = _ops.semiseparable(np.ascontiguousarray(dt * A[None, :]), B, C, heads=H, head_dim=P, groups=G)
            core = S * _ops.diagonal(np.repeat(dt, P, axis=1)) + _ops.diagonal(np.repeat(_np(module.D), P)[None, :].copy())
            sig = _sigmoid(p[:, :di])
            body = core * _ops.diagonal(np.ascontiguousarray(sig)) * _ops.causal_conv(np.ascontiguousarray(conv_w[:di].T))
            beta_pre = core.apply(np.ascontiguousarray(sig * conv_b[:, :di])) if conv_b is not None else np.zeros_like(x)
            if before:  # N bound to the statistics of its input y = body x + beta_pre (grouped RMS), then the gate
                y = body.apply(x) + beta_pre
                var = (y.reshape(L, G, di // G) ** 2).mean(axis=-1, keepdims=True)
                r = np.broadcast_to(1.0 / np.sqrt(var + float(module.norm.variance_epsilon)), (L, G, di // G)).reshape(L, di)
                scale = _silu(z) * _np(module.norm.weight)[None, :] * r
            else:
                scale = _silu(z)
            Hop = _ops.diagonal(np.ascontiguousarray(scale)) * body
            out.append(Decomposition(Hop, x, np.ascontiguousarray(scale * beta_pre), out_w, out_b))
    return out


def _decompose_xlstm(layer, u):
    """transformers' xLSTM mLSTM layer (xLSTM-7B, `xLSTMLayer`): q, k, v, the output gate and the soft-capped gate
    pre-activations computed with the module's own layers; then, per head (NH heads; q, k of width dqk, v of dv):
      S[t, s] = q_t . k_s / sqrt(dqk) exp(F_t - F_s + i_s - i_max),  F the cumulative logsigmoid(f)   (semiseparable)
      rho_t   = e_t / (max(e_t |sum_s S[t, s]|, exp(-m_t)) + eps),  e_t = exp(i_max - m_t)
      H       = diag(sigmoid(o) w / sigma_t) diag(rho) S,  beta = sigmoid(o) (b - mu_t w / sigma_t)
    with m_t the kernel's stabiliser (m_t = max(logsigmoid(f_t) + m_{t-1}, i_t), m_{-1} = 0, as its native kernels
    start from a zero state), the multi-head layer norm's mean mu_t and deviation sigma_t bound to the forward pass,
    and x = v. rho is the normaliser max(|q.n|, exp(-m)) fixed at its forward-pass value per token and head."""
    import torch

    cfg = layer.config
    NH = cfg.num_heads
    cap = cfg.gate_soft_cap
    soft = (lambda t: t) if cap is None else (lambda t: cap * torch.tanh(t / cap))
    eps = float(layer.mlstm_backend.config.eps)
    norm = layer.multihead_norm
    out_w = _np(layer.out_proj.weight)
    out_b = _row(layer.out_proj.bias) if layer.out_proj.bias is not None else None
    out = []
    with torch.no_grad():
        for ub in u:
            x_in = torch.from_numpy(np.ascontiguousarray(ub)).unsqueeze(0)
            q, k, v, o = layer.q(x_in), layer.k(x_in), layer.v(x_in), layer.ogate_preact(x_in)
            i, f = soft(layer.igate_preact(x_in)), soft(layer.fgate_preact(x_in))
            q, k, v, o, i, f = (np.ascontiguousarray(_np(t[0])) for t in (q, k, v, o, i, f))
            L = v.shape[0]
            dqk, dv = q.shape[1] // NH, v.shape[1] // NH
            lf = -np.logaddexp(0.0, -f)  # logsigmoid
            m = np.empty_like(i)
            prev = np.zeros(NH, i.dtype)
            for t in range(L):
                m[t] = prev = np.maximum(lf[t] + prev, i[t])
            imax = i.max(axis=0, keepdims=True)
            Bk = k * np.repeat(np.exp(i - imax), dqk, axis=1) * float(dqk) ** -0.5
            S = _ops.semiseparable(np.ascontiguousarray(lf), np.ascontiguousarray(Bk), q, heads=NH, head_dim=dv, groups=NH)
            r = S.apply(np.ones_like(v))
            e = np.repeat(np.exp(imax - m), dv, axis=1)
            rho = e / (np.maximum(e * np.abs(r), np.repeat(np.exp(-m), dv, axis=1)) + eps)
            cell = _ops.diagonal(np.ascontiguousarray(rho)) * S
            h = cell.apply(v).reshape(L, NH, dv)
            mu = h.mean(axis=-1, keepdims=True)
            inv = 1.0 / np.sqrt(h.var(axis=-1, keepdims=True) + float(norm.eps))
            w = _np(norm.weight) if norm.weight is not None else np.ones(NH * dv, v.dtype)
            b = _np(norm.bias) if norm.bias is not None else np.zeros(NH * dv, v.dtype)
            scale = np.broadcast_to(inv, (L, NH, dv)).reshape(L, NH * dv) * w[None, :]
            offset = b[None, :] - np.broadcast_to(mu * inv, (L, NH, dv)).reshape(L, NH * dv) * w[None, :]
            gate = _sigmoid(o)
            Hop = _ops.diagonal(np.ascontiguousarray(gate * scale)) * cell
            out.append(Decomposition(Hop, v, np.ascontiguousarray(gate * offset), out_w, out_b))
    return out


@dataclass
class _Mixer:
    """One hooked layer: its index, its kind and how to decompose it from the captured input."""
    index: int
    kind: str                      # an iattn.models name ("mamba", "mamba2", ...) or "attention"
    module: Any
    decompose: Callable[[Any, np.ndarray], list] | None = None  # (module, u (batch, L, d)) -> per batch element
    output_of: Callable[[Any], Any] = _first  # the hook's output -> the mixer's output tensor
    parallel: bool = False         # a branch that runs beside the layer's other branches on the same input (falcon_h1)
    output_scale: float = 1.0      # the multiplier on this branch's output where it joins the residual stream
    rebuild: Callable[[Any, Any, Any], Any] | None = None  # attention: (module, u, probs) -> output, for the check


_MAMBA = _decompose_by_weights("mamba", _mamba_weights)


def _attention(i, module, **kw):
    return _Mixer(i, "attention", module, **kw)


def _layers_mamba(model):
    backbone = getattr(model, "backbone", model)
    return [_Mixer(i, "mamba", layer.mixer, _MAMBA) for i, layer in enumerate(backbone.layers)]


def _layers_falcon_mamba(model):
    backbone = getattr(model, "backbone", model)
    return [_Mixer(i, "mamba", layer.mixer, _decompose_normed_mamba) for i, layer in enumerate(backbone.layers)]


def _layers_mamba2(model):
    backbone = getattr(model, "backbone", model)
    return [_Mixer(i, "mamba2", layer.mixer, _decompose_mamba2) for i, layer in enumerate(backbone.layers)]


def _layers_hybrid(mamba_attr, decompose, kind):
    """Decoder layers holding either `mamba_attr` (the mixer) or `self_attn` (softmax attention)."""
    def layers(model):
        base = getattr(model, "model", model)
        out = []
        for i, layer in enumerate(base.layers):
            mixer = getattr(layer, mamba_attr, None)
            attn = getattr(layer, "self_attn", None)
            if mixer is not None and attn is not None:
                raise ValueError(f"iattn.hf: layer {i} runs a mixer and attention in parallel; not supported")
            if mixer is not None:
                out.append(_Mixer(i, kind, mixer, decompose))
            elif attn is not None:
                out.append(_attention(i, attn))
        return out
    return layers


def _layers_nemotron_h(model):
    base = getattr(model, "model", model)
    out = []
    for i, layer in enumerate(base.layers):
        kind = getattr(layer, "block_type", None)
        if kind in ("mamba", "linear_attention"):
            out.append(_Mixer(i, "mamba2", layer.mixer, _decompose_mamba2))
        elif kind in ("attention", "full_attention"):
            out.append(_attention(i, layer.mixer))
    return out


def _layers_zamba2(model):
    base = getattr(model, "model", model)
    out = []
    for i, layer in enumerate(base.layers):
        if hasattr(layer, "shared_transformer"):
            out.append(_attention(i, layer.shared_transformer.self_attn))
            out.append(_Mixer(i, "mamba2", layer.mamba_decoder.mamba, _decompose_mamba2))
        else:
            out.append(_Mixer(i, "mamba2", layer.mamba, _decompose_mamba2))
    return out


def _layers_rwkv(model):
    base = getattr(model, "rwkv", model)
    return [_Mixer(i, "rwkv4", block.attention, _decompose_by_weights("rwkv4", _rwkv_weights))
            for i, block in enumerate(base.blocks)]


def _layers_recurrent_gemma(model):
    base = getattr(model, "model", model)
    out = []
    for i, layer in enumerate(base.layers):
        block = layer.temporal_block
        if hasattr(block, "rg_lru"):
            out.append(_Mixer(i, "griffin", block, _decompose_by_weights("griffin", _griffin_weights)))
        else:
            out.append(_attention(i, block))
    return out


def _layers_qwen3_next(model):
    base = getattr(model, "model", model)
    out = []
    for i, layer in enumerate(base.layers):
        if getattr(layer, "linear_attn", None) is not None:
            out.append(_Mixer(i, "qwen3_next", layer.linear_attn, _decompose_by_weights("qwen3_next", _qwen3_next_weights)))
        else:
            out.append(_attention(i, layer.self_attn))
    return out


def _layers_falcon_h1(model):
    """Every decoder layer runs its Mamba-2 mixer and its softmax attention in parallel on the same normed input and
    adds mamba * ssm_out_multiplier + attention * attention_out_multiplier: two entries per layer index, marked
    parallel, each with its multiplier (Explanation.layer_maps combines them into one map per layer)."""
    base = getattr(model, "model", model)
    out = []
    for i, layer in enumerate(base.layers):
        out.append(_Mixer(i, "mamba2", layer.mamba, _decompose_falcon_h1_mamba, parallel=True,
                          output_scale=float(layer.ssm_out_multiplier)))
        out.append(_attention(i, layer.self_attn, parallel=True, output_scale=float(layer.attn_out_multiplier)))
    return out


def _layers_xlstm(model):
    base = getattr(model, "backbone", model)
    mode = getattr(model.config, "weight_mode", "single")
    if mode != "single":  # the fused layout: transformers 5.24 cannot initialise it, so it could not be tested
        raise ValueError(f"iattn.hf: xlstm weight_mode {mode!r} is not supported; supported: single")
    return [_Mixer(i, "mlstm", block.mlstm_layer, _decompose_xlstm) for i, block in enumerate(base.blocks)]


def _layers_kimi_linear(model):
    base = getattr(model, "model", model)
    out = []
    for i, layer in enumerate(base.layers):
        attn = layer.self_attn
        if hasattr(attn, "forget_gate"):  # Kimi Delta Attention
            out.append(_Mixer(i, "kimi_linear", attn, _decompose_by_weights("kimi_linear", _kimi_linear_weights)))
        else:  # MLA softmax attention
            out.append(_attention(i, attn))
    return out


_ADAPTERS: dict[str, Callable[[Any], list]] = {
    "mamba": _layers_mamba,
    "falcon_mamba": _layers_falcon_mamba,
    "mamba2": _layers_mamba2,
    "jamba": _layers_hybrid("mamba", _decompose_normed_mamba, "mamba"),
    "bamba": _layers_hybrid("mamba", _decompose_mamba2, "mamba2"),
    "granitemoehybrid": _layers_hybrid("mamba", _decompose_mamba2, "mamba2"),
    "nemotron_h": _layers_nemotron_h,
    "zamba2": _layers_zamba2,
    "rwkv": _layers_rwkv,
    "recurrent_gemma": _layers_recurrent_gemma,
    "qwen3_next": _layers_qwen3_next,
    "falcon_h1": _layers_falcon_h1,
    "xlstm": _layers_xlstm,
    "kimi_linear": _layers_kimi_linear,
}


def supported_model_types() -> list[str]:
    """The transformers model types explain() accepts."""
    return sorted(_ADAPTERS)


# ---- the result -------------------------------------------------------------------------------------

@dataclass
class LayerMap:
    """One layer of an Explanation.

    kind: the mixer kind (an iattn.models name: "mamba", "mamba2", "rwkv4", "griffin", "qwen3_next", "kimi_linear",
    "mlstm" (xLSTM), ...) or "attention" (softmax, exact).
    decompositions: per batch element, the iattn.Decomposition (None for attention layers).
    attention: (batch, heads, L, L) softmax probabilities of an attention layer (None otherwise).
    mixer_input, mixer_output: what the hooks captured, (batch, L, d_model) numpy arrays.
    parallel: True for a branch of a layer whose branches run side by side on the same input (falcon_h1: its
    Mamba-2 mixer and its attention); output_scale: the multiplier on the branch's output where it joins the
    residual stream (falcon_h1's ssm_out_multiplier / attention_out_multiplier; 1 elsewhere).
    """
    index: int
    kind: str
    decompositions: list | None
    attention: np.ndarray | None
    mixer_input: np.ndarray
    mixer_output: np.ndarray

    def maps(self, *, abs: bool = True, heads: bool = True) -> np.ndarray:
        """(batch, heads, L, L): per head the mean over its channels of H^c (|H^c| with abs=True), one map when
        the layer has no heads (Mamba-1, RWKV, Griffin) or heads=False; an attention layer's probabilities."""
        if self.attention is not None:
            a = self.attention
            return a if heads else a.mean(axis=1, keepdims=True)
        key = (abs, heads)
        if key not in self._maps:  # computed once per layer and kind (the rollout and friends ask per batch element)
            out = []
            for d in self.decompositions:
                if heads and d.H.head_dim > 1:
                    out.append(d.head_means(abs=abs))
                else:
                    out.append(d.mean(abs=abs)[None])
            self._maps[key] = np.stack(out)
            self._maps[key].flags.writeable = False
        return self._maps[key]

    reconstruction: np.ndarray | None = None
    parallel: bool = False
    output_scale: float = 1.0
    _maps: dict = field(default_factory=dict, repr=False)

    def relative_error(self) -> float:
        """max |mixer output - out_proj(H x + beta)| / max |mixer output| over the batch; for an attention layer,
        against o_proj(A v) rebuilt from its probabilities A (NaN when the module has no v_proj/o_proj)."""
        y = self.mixer_output
        if self.decompositions is None:
            if self.reconstruction is None:
                return float("nan")
            err = np.abs(self.reconstruction - y).max()
            return float(err / max(np.abs(y).max(), np.finfo(np.float64).tiny))
        err = max(np.abs(d.output() - y[b]).max() for b, d in enumerate(self.decompositions))
        return float(err / max(np.abs(y).max(), np.finfo(np.float64).tiny))


@dataclass
class Explanation:
    """The per-layer implicit attention of one forward pass (see iattn.hf.explain)."""
    model_type: str
    layers: list[LayerMap] = field(default_factory=list)

    def maps(self, *, abs: bool = True, heads: bool = True) -> list[np.ndarray]:
        """Per layer (batch, heads, L, L), the layout bertviz's head_view takes (as torch tensors there)."""
        return [layer.maps(abs=abs, heads=heads) for layer in self.layers]

    def _stages(self) -> list[list[LayerMap]]:
        """The entries grouped into the stack's sequential stages: consecutive parallel branches of one layer index
        form one stage (falcon_h1), every other entry is a stage of its own (zamba2's shared attention and its
        Mamba-2 mixer run one after the other, so they stay two stages)."""
        stages: list[list[LayerMap]] = []
        for layer in self.layers:
            prev = stages[-1][-1] if stages else None
            if layer.parallel and prev is not None and prev.parallel and prev.index == layer.index:
                stages[-1].append(layer)
            else:
                stages.append([layer])
        return stages

    @staticmethod
    def _branch_weights(stage: list[LayerMap], batch: int) -> np.ndarray:
        """Each parallel branch's share of what the layer adds to the residual stream: |output_scale| times the
        Frobenius norm of the hooked branch output for this batch element, normalised to sum to 1."""
        w = np.array([abs(b.output_scale) * float(np.linalg.norm(b.mixer_output[batch])) for b in stage])
        return w / w.sum() if w.sum() > 0 else np.full(len(stage), 1.0 / len(stage))

    def layer_maps(self, batch: int = 0) -> list[np.ndarray]:
        """Per stage of the stack one (L, L) map for batch element `batch`: the mean over heads of the |H| maps (the
        probabilities of an attention layer). A layer of parallel branches (falcon_h1) gives one map: each branch's
        map with its rows normalised to sum 1, weighted by the branch's share of the layer's output
        (|output_scale| ||branch output||, see docs/python.md)."""
        out = []
        for stage in self._stages():
            maps = [layer.maps(abs=True)[batch].mean(axis=0) for layer in stage]
            if len(stage) == 1:
                out.append(maps[0])
                continue
            w = self._branch_weights(stage, batch)
            combined = np.zeros_like(maps[0])
            for wk, mk in zip(w, maps):
                rows = mk.sum(axis=1, keepdims=True)
                combined += wk * np.divide(mk, rows, out=np.zeros_like(mk), where=rows != 0)
            out.append(combined)
        return out

    def rollout(self, batch: int = 0, *, start_layer: int = 0) -> np.ndarray:
        """Attention rollout over the whole stack, (L, L): row q is token q's relevance over the tokens."""
        return _explain.rollout(self.layer_maps(batch), start_layer=start_layer)

    def raw_attention(self, batch: int = 0) -> np.ndarray:
        """The mean over layers of the per-layer maps, (L, L)."""
        return _explain.raw_attention(self.layer_maps(batch))

    def attribution(self, batch: int = 0, *, query: int = -1, target=None, start_layer: int = 0) -> np.ndarray:
        """Mamba-Attribution (Ali et al.) over the stack, (L, L), with each layer's token scores from the exact
        gradient of its frozen decomposition at `query` projected on `target` (d_model,) (default: the
        mixer's own output at the query, i.e. the direction the layer writes). Attention layers score 1."""
        maps, scores = self.layer_maps(batch), []
        for stage, m in zip(self._stages(), maps):
            L = m.shape[0]
            q = query % L
            per_branch = []
            for layer in stage:
                if layer.decompositions is None:
                    per_branch.append(np.ones((1, L), m.dtype))
                    continue
                d = layer.decompositions[batch]
                t = layer.mixer_output[batch, q] if target is None else np.asarray(target, m.dtype)
                per_branch.append(_explain.gradient_scores(_explain.frozen_gradient(d, q, np.ascontiguousarray(t, dtype=m.dtype))))
            if len(stage) == 1:
                scores.append(per_branch[0])
            else:  # parallel branches: their scores weighted as their maps are
                w = self._branch_weights(stage, batch)
                scores.append(np.ascontiguousarray(sum(wk * sk for wk, sk in zip(w, per_branch)), dtype=m.dtype))
        return _explain.mamba_attribution(maps, scores, start_layer=start_layer)

    def max_relative_error(self) -> float:
        """The largest relative error of any layer's decomposition against its hooked mixer output (layers that
        cannot be rebuilt, NaN, are left out)."""
        errors = [e for e in (layer.relative_error() for layer in self.layers) if not np.isnan(e)]
        return max(errors, default=0.0)

    def save(self, directory: str | os.PathLike, *, batch: int = 0, scale: int = 4) -> list[str]:
        """Writes per layer the map .npy (heads, L, L) and a PNG of the head mean, the rollout, and an index.html;
        returns the written paths."""
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        written, rows = [], []
        for layer in self.layers:
            m = layer.maps(abs=True)[batch]
            stem = f"layer{layer.index:02d}_{layer.kind}"
            np.save(os.path.join(directory, stem + ".npy"), m)
            _explain.save_png(os.path.join(directory, stem + ".png"), _explain.heatmap(m.mean(axis=0), scale=scale))
            written += [stem + ".npy", stem + ".png"]
            rows.append((f"layer {layer.index} ({layer.kind}, {m.shape[0]} head{'s' if m.shape[0] != 1 else ''})", stem + ".png"))
        roll = self.rollout(batch)
        np.save(os.path.join(directory, "rollout.npy"), roll)
        _explain.save_png(os.path.join(directory, "rollout.png"), _explain.heatmap(roll, scale=scale))
        written += ["rollout.npy", "rollout.png"]
        rows.append(("rollout over the stack", "rollout.png"))
        cells = "\n".join(f'<figure><img src="{html.escape(src)}"><figcaption>{html.escape(cap)}</figcaption></figure>'
                          for cap, src in rows)
        page = (f"<!doctype html><meta charset=utf-8><title>iattn: {html.escape(self.model_type)}</title>"
                "<style>body{font-family:sans-serif}figure{display:inline-block;margin:8px}img{image-rendering:pixelated}</style>"
                f"<h1>{html.escape(self.model_type)}: implicit attention per layer</h1>"
                f"<p>Mean over heads of the mean over channels of |H<sup>c</sup>| (viridis, min-max per map). "
                f"Max relative error of the decompositions against the hooked mixer outputs: {self.max_relative_error():.2e}.</p>\n{cells}\n")
        with open(os.path.join(directory, "index.html"), "w", encoding="utf-8") as f:
            f.write(page)
        written.append("index.html")
        return [os.path.join(directory, p) for p in written]


# ---- explain ----------------------------------------------------------------------------------------

def _attention_output(module, u, probs):
    """o_proj(A v) from an attention module's probabilities A (batch, heads, L, L) and its input u, where it
    has v_proj and o_proj (grouped key/value heads repeated): the check that the maps are the layer's own."""
    import torch

    if hasattr(module, "kv_b_proj") and hasattr(module, "o_proj"):
        return _mla_attention_output(module, u, probs)
    if not (hasattr(module, "v_proj") and hasattr(module, "o_proj")):
        return None
    cfg = getattr(module, "config", None)
    if getattr(cfg, "use_shared_attention_adapter", False):  # zamba2: v = v_proj(x) + adapter(x), not rebuilt here
        return None
    with torch.no_grad():
        B, L, _ = u.shape
        heads = probs.shape[1]
        v = module.v_proj(u)
        hd = getattr(module, "head_dim", None) or v.shape[-1] // heads
        kv = v.shape[-1] // hd
        v = v.view(B, L, kv, hd).transpose(1, 2).repeat_interleave(heads // kv, dim=1)
        y = torch.matmul(probs.to(v.dtype), v).transpose(1, 2).reshape(B, L, heads * hd)
        q = getattr(module, "q_proj", None)
        if q is not None and q.out_features == 2 * heads * hd:  # qwen3_next: an output gate from q_proj's second half
            gate = q(u).view(B, L, heads, 2 * hd)[..., hd:].reshape(B, L, heads * hd)
            y = y * torch.sigmoid(gate)
        return _np(module.o_proj(y))


def _mla_attention_output(module, u, probs):
    """o_proj(A v) for multi-head latent attention (kimi_linear's MLA layers): v from the module's own layers,
    kv_b_proj(kv_a_layernorm(kv_a_proj_with_mqa(u)'s latent part)), each head's value part."""
    import torch

    with torch.no_grad():
        B, L, _ = u.shape
        latent = module.kv_a_proj_with_mqa(u)[..., : module.kv_lora_rank]
        kv = module.kv_b_proj(module.kv_a_layernorm(latent))
        kv = kv.view(B, L, -1, module.qk_nope_head_dim + module.v_head_dim).transpose(1, 2)
        v = kv[..., module.qk_nope_head_dim:]
        heads = probs.shape[1]
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
        y = torch.matmul(probs.to(v.dtype), v).transpose(1, 2).reshape(B, L, heads * module.v_head_dim)
        return _np(module.o_proj(y))


class _Progress:
    """A one-line progress bar on stderr (no dependency), shown for more than one step."""

    def __init__(self, total: int, enabled: bool, label: str):
        self.total, self.enabled, self.label, self.done = total, enabled and total > 1, label, 0

    def step(self):
        self.done += 1
        if self.enabled:
            n = 30 * self.done // self.total
            sys.stderr.write(f"\r{self.label} [{'#' * n}{'.' * (30 - n)}] {self.done}/{self.total}")
            if self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def explain(model, input_ids=None, *, inputs_embeds=None, progress: bool | None = None, **forward_kwargs) -> Explanation:
    """Runs `model` once (no gradients) with forward hooks on its mixers and returns every layer's implicit
    attention as an Explanation.

    model: a transformers model (e.g. MambaForCausalLM) in float32 or float64 whose config.model_type is
    one of supported_model_types(). input_ids (batch, L) or inputs_embeds (batch, L, d_model); other
    keyword arguments go to the model's forward. Padding is not supported (no attention_mask with zeros).
    progress: a progress bar over the layers on stderr (default: when stderr is a terminal).
    """
    import torch

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in _ADAPTERS:
        raise ValueError(f"iattn.hf.explain: model type {model_type!r} is not supported; supported: "
                         + ", ".join(supported_model_types()))
    mask = forward_kwargs.get("attention_mask")
    if mask is not None and not bool(torch.all(mask != 0)):
        raise ValueError("iattn.hf.explain: attention_mask has padding (zeros); explain one unpadded sequence per row")
    mixers = _ADAPTERS[model_type](model)
    dtype = _dtype_name(next(model.parameters()))
    captured: dict[int, tuple] = {}  # by position in `mixers` (a zamba2 layer has two)
    hooks = []
    has_attention = any(m.kind == "attention" for m in mixers)
    previous_impl = getattr(model.config, "_attn_implementation", None)
    if has_attention:
        model.set_attn_implementation("eager")  # the attention modules then return their probabilities
    try:
        for k, m in enumerate(mixers):
            def hook(module, args, kwargs, output, k=k):
                u = args[0] if args else kwargs.get("hidden_states", next(iter(kwargs.values())))
                captured[k] = (u, kwargs, output)
            hooks.append(m.module.register_forward_hook(hook, with_kwargs=True))
        with torch.no_grad():
            if inputs_embeds is not None:
                model(inputs_embeds=inputs_embeds, **forward_kwargs)
            else:
                model(input_ids=input_ids, **forward_kwargs)
    finally:
        for h in hooks:
            h.remove()
        if has_attention and previous_impl is not None:
            model.set_attn_implementation(previous_impl)

    if progress is None:
        progress = sys.stderr.isatty()
    bar = _Progress(len(mixers), progress, f"iattn: {model_type}")
    ex = Explanation(model_type)
    for k, m in enumerate(mixers):
        if k not in captured:
            raise RuntimeError(f"iattn.hf.explain: layer {m.index}'s {m.kind} module was not called by the forward pass")
        u, kwargs, out = captured[k]
        if m.kind == "attention":
            if not isinstance(out, (tuple, list)) or len(out) < 2 or out[1] is None:
                raise RuntimeError(f"iattn.hf.explain: layer {m.index}'s attention returned no probabilities under eager attention")
            probs = _np(out[1]).astype(dtype)
            layer = LayerMap(m.index, "attention", None, probs, _np(u), _np(_first(out)), parallel=m.parallel,
                             output_scale=m.output_scale)
            layer.reconstruction = (m.rebuild or _attention_output)(m.module, u, out[1])
            ex.layers.append(layer)
            bar.step()
            continue
        u_np, y_np = _np(u), _np(m.output_of(out))
        if m.kind == "griffin":
            pos = kwargs.get("position_ids")
            if pos is not None and not np.array_equal(_np(pos), np.broadcast_to(np.arange(u_np.shape[1]), _np(pos).shape)):
                raise ValueError("iattn.hf.explain: position_ids other than 0..L-1 are not supported for recurrent_gemma")
        decs = m.decompose(m.module, u_np)
        ex.layers.append(LayerMap(m.index, m.kind, decs, None, u_np, y_np, parallel=m.parallel, output_scale=m.output_scale))
        bar.step()
    return ex
