#!/usr/bin/env python3
"""Writes the reference cross-check fixtures under tests/data/reference/ (see its README.md).

Run from the repository root, in the venv made by tools/reference/setup_venv.sh:

    .venv/bin/python tools/reference/make_fixtures.py [--out tests/data/reference] [--seed 20261]

Every case runs the reference implementation itself (transformers' layer modules, fla's naive
recurrences, fla's RWKV-7 and GatedDeltaProduct layers), on CPU, in float64. Where a reference casts to float32 internally, the function is
re-created at run time from its own installed source with the float32 casts replaced by float64
(`fp64_clone`: inspect.getsource + exec); nothing of the references' code is copied into this file.
Fixtures are float64 .npy files in C order; the C++ test tests/models/reference_test.cpp reads them.
"""

import __future__
import argparse
import datetime
import importlib.metadata
import importlib.util
import inspect
import json
import os
import platform
import re
import sys
import textwrap
import warnings

import numpy as np
import torch

torch.set_default_dtype(torch.float64)

L_LAYER = 37  # sequence length of the layer cases
L_NAIVE = 33  # sequence length of the naive-recurrence cases


# --------------------------------------------------------------------------------------------
# Helpers


def fp64_source(src):
    """The function's source with its float32 casts made float64 and its leading decorators dropped."""
    src = textwrap.dedent(src)
    lines = src.splitlines()
    while lines and lines[0].lstrip().startswith("@"):  # decorators only, never an '@' operator line
        lines.pop(0)
    out = "\n".join(lines) + "\n"
    out = out.replace("torch.float32", "torch.float64")
    out = re.sub(r"torch\.float\b(?!\d)", "torch.float64", out)
    out = out.replace(".float()", ".double()")
    return out


def fp64_clone(fn, ns, must_change=True):
    """Re-creates fn (a function or method, unwrapped) from its own source with float32 -> float64,
    executed in the namespace ns (a copy of its module's globals); returns the new function."""
    fn = inspect.unwrap(fn)
    src = textwrap.dedent(inspect.getsource(fn))
    new = fp64_source(src)
    if must_change and "float32" not in src and ".float()" not in src and not re.search(r"torch\.float\b", src):
        raise RuntimeError(f"{fn.__qualname__}: no float32 cast found to patch; the reference changed, review the script")
    for bad in ("float32", ".float()"):
        if bad in new:
            raise RuntimeError(f"{fn.__qualname__}: '{bad}' left after patching")
    # A module written with `from __future__ import annotations` may annotate with names it imports
    # only under TYPE_CHECKING (fla's layers): compile with that flag too, as the module was.
    feat = ns.get("annotations")
    flags = feat.compiler_flag if isinstance(feat, __future__._Feature) else 0
    exec(compile(new, f"<fp64 {fn.__module__}.{fn.__qualname__}>", "exec", flags=flags, dont_inherit=True), ns)
    return ns[fn.__name__]


def load_by_path(rel):
    """Loads fla/<rel> as a standalone module (fla/ops/__init__ imports Triton; the naive files do not)."""
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("fla-core is not installed")
    site = os.path.dirname(list(spec.submodule_search_locations)[0])
    path = os.path.join(site, rel)
    mspec = importlib.util.spec_from_file_location("iattn_ref_" + rel.replace("/", "_")[:-3], path)
    mod = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(mod)
    return mod


def np64(t):
    return np.ascontiguousarray(t.detach().to(torch.float64).cpu().numpy())


class Writer:
    def __init__(self, root):
        self.root = root
        self.sizes = {}

    def __call__(self, case, name, arr):
        arr = np.asarray(arr, dtype=np.float64)
        if arr.ndim == 0:
            arr = arr.reshape(1, 1)  # a scalar as a (1, 1) matrix
        arr = np.ascontiguousarray(arr)
        assert arr.ndim <= 2, (case, name, arr.shape)
        d = os.path.join(self.root, case)
        os.makedirs(d, exist_ok=True)
        np.save(os.path.join(d, name + ".npy"), arr)
        self.sizes.setdefault(case, {})[name] = list(arr.shape)


def tokens_heads(x):
    """(1, T, H, d) -> (T, H*d), token-major, head-major columns."""
    assert x.shape[0] == 1
    return np64(x[0].reshape(x.shape[1], -1))


def state_rows(S):
    """(1, H, dk, dv) -> (H*dk, dv): head h's (key, value) block in rows h*dk.."""
    assert S.shape[0] == 1
    return np64(S[0].reshape(-1, S.shape[-1]))


def l2n(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True))


# --------------------------------------------------------------------------------------------
# a. transformers Qwen3NextGatedDeltaNet


def qwen3_next_case(put, gen):
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next import modeling_qwen3_next as M

    cfg = Qwen3NextConfig(vocab_size=64, hidden_size=24, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                          linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                          linear_value_head_dim=6, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
                          num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                          shared_expert_intermediate_size=16, layer_types=["linear_attention"])
    mix = M.Qwen3NextGatedDeltaNet(cfg, layer_idx=0).double().eval()
    nv = cfg.linear_num_value_heads
    with torch.no_grad():
        for name, p in mix.named_parameters():
            if name == "A_log":       # exp(A_log) in (0.08, 0.35): exp(g) mostly in (0.3, 1)
                p.copy_(torch.empty(nv).uniform_(0.08, 0.35, generator=gen).log())
            elif name == "dt_bias":
                p.copy_(torch.randn(nv, generator=gen) * 0.5)
            elif name == "norm.weight":
                p.copy_(torch.empty(p.shape).uniform_(0.5, 1.5, generator=gen))
            else:                     # in_proj_qkvz, in_proj_ba, conv1d, out_proj
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)

    u = torch.randn(1, L_LAYER, cfg.hidden_size, generator=gen)
    # The stock reference (float32 inside) once, for the record: the fp64 patch must change rounding
    # only. The hub decorator may have swapped in fla's Triton kernel (fails on CPU): unwrap it.
    M.torch_chunk_gated_delta_rule = inspect.unwrap(M.torch_chunk_gated_delta_rule)
    M.causal_conv1d_fn = inspect.unwrap(M.causal_conv1d_fn)
    with torch.no_grad():
        out_stock = mix(u)

    # fp64 reference: the core, the gated norm and the layer's forward (A_log.float(), a.float())
    # re-created from their own source with float32 -> float64, in a copy of the module's globals.
    ns = dict(vars(M))
    core = fp64_clone(M.torch_chunk_gated_delta_rule, ns)
    recurrent = fp64_clone(M.torch_recurrent_gated_delta_rule, ns)
    norm_forward = fp64_clone(M.Qwen3NextRMSNormGated.forward, ns)
    layer_forward = fp64_clone(M.Qwen3NextGatedDeltaNet.forward, ns)
    captured = {}

    def core_capturing(*args, **kwargs):
        # The layer passes output_final_state=(cache is not None); we ask the core for the state
        # instead of building a cache. Same function, same inputs.
        kwargs["output_final_state"] = True
        out, state = core(*args, **kwargs)
        captured.update(args=args, kwargs=dict(kwargs), out=out, state=state)
        return out, state

    ns["torch_chunk_gated_delta_rule"] = core_capturing
    ns["causal_conv1d_fn"] = inspect.unwrap(M.causal_conv1d_fn)  # torch fallback, no casts
    M.Qwen3NextRMSNormGated.forward = norm_forward
    type(mix).forward = layer_forward

    with torch.no_grad():
        out = mix(u)
        # cross-check: the recurrent variant of the same reference on the same core inputs
        kw = dict(captured["kwargs"])
        kw.pop("cu_seqlens", None)
        o_rec, s_rec = recurrent(*captured["args"], **kw)
    d_out = (o_rec - captured["out"]).abs().max().item()
    d_state = (s_rec - captured["state"]).abs().max().item()
    assert d_out < 1e-10 and d_state < 1e-10, (d_out, d_state)
    alpha = captured["kwargs"]["g"].exp()
    d_stock = (out_stock - out).abs().max().item() / (1 + out.abs().max().item())
    assert d_stock < 1e-4, d_stock

    case = "qwen3_next_layer"
    for name, p in mix.state_dict().items():
        a = np64(p)
        if name == "conv1d.weight":
            a = a[:, 0, :]  # (conv_dim, 1, K) -> (conv_dim, K)
        put(case, name.replace(".", "_"), a)
    put(case, "u", np64(u[0]))
    put(case, "out", np64(out[0]))
    put(case, "final_state", state_rows(captured["state"]))
    return {"hidden_size": 24, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
            "linear_value_head_dim": 6, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6, "L": L_LAYER,
            "exp_g_range": [alpha.min().item(), alpha.max().item()],
            "chunk_vs_recurrent_max_abs": [d_out, d_state], "stock_fp32_vs_fp64_rel": d_stock}


# --------------------------------------------------------------------------------------------
# b. transformers KimiLinearDeltaAttention


def kimi_linear_case(put, gen):
    from transformers import KimiLinearConfig
    from transformers.models.kimi_linear import modeling_kimi_linear as M

    H, d, hidden = 3, 8, 24
    cfg = KimiLinearConfig(vocab_size=64, hidden_size=hidden, intermediate_size=32, moe_intermediate_size=16,
                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=8,
                           q_lora_rank=None, qk_rope_head_dim=4, v_head_dim=8, qk_nope_head_dim=8,
                           num_local_experts=2, num_experts_per_tok=1, linear_head_dim=d, linear_num_heads=H,
                           linear_conv_kernel_dim=4, rms_norm_eps=1e-5, pad_token_id=0, bos_token_id=1,
                           eos_token_id=2, layer_types=["linear_attention"], mlp_layer_types=["dense"])
    mix = M.KimiLinearDeltaAttention(cfg, layer_idx=0).double().eval()
    with torch.no_grad():
        for name, p in mix.named_parameters():
            if name == "forget_gate.A_log":   # (1, 1, H, 1); exp(A_log) in (0.08, 0.35)
                p.copy_(torch.empty(p.shape).uniform_(0.08, 0.35, generator=gen).log())
            elif name == "forget_gate.dt_bias":
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif name == "o_norm.weight":
                p.copy_(torch.empty(p.shape).uniform_(0.5, 1.5, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    assert all(p.dtype == torch.float64 for p in mix.parameters())

    u = torch.randn(1, L_LAYER, hidden, generator=gen)
    M.chunk_kimi_delta_attention = inspect.unwrap(M.chunk_kimi_delta_attention)
    M.causal_conv1d_fn = inspect.unwrap(M.causal_conv1d_fn)
    with torch.no_grad():
        out_stock = mix(u)  # stock reference, float32 inside

    ns = dict(vars(M))
    core = fp64_clone(M.chunk_kimi_delta_attention, ns)
    recurrent = fp64_clone(M.recurrent_kimi_delta_attention, ns)
    M.KimiLinearRMSNormGated.forward = fp64_clone(M.KimiLinearRMSNormGated.forward, ns)
    M.KimiLinearForgetGate.forward = fp64_clone(M.KimiLinearForgetGate.forward, ns)
    captured = {}

    def core_capturing(*args, **kwargs):
        kwargs["output_final_state"] = True
        out, state = core(*args, **kwargs)
        captured.update(args=args, kwargs=dict(kwargs), out=out, state=state)
        return out, state

    # The layer's forward has no float32 cast on the path without a cache; it reads these names from
    # the module's globals at call time.
    M.chunk_kimi_delta_attention = core_capturing

    with torch.no_grad():
        out = mix(u)
        o_rec, s_rec = recurrent(*captured["args"], **captured["kwargs"])
    d_out = (o_rec - captured["out"]).abs().max().item()
    d_state = (s_rec - captured["state"]).abs().max().item()
    assert d_out < 1e-10 and d_state < 1e-10, (d_out, d_state)
    alpha = captured["kwargs"]["g"].exp()
    d_stock = (out_stock - out).abs().max().item() / (1 + out.abs().max().item())
    assert d_stock < 1e-4, d_stock

    case = "kimi_linear_layer"
    for name, p in mix.state_dict().items():
        a = np64(p)
        if name == "conv1d.weight":
            a = a[:, 0, :]
        elif name == "forget_gate.A_log":
            a = a.reshape(1, H)  # (1, 1, H, 1) -> (1, H)
        put(case, name.replace(".", "_"), a)
    put(case, "u", np64(u[0]))
    put(case, "out", np64(out[0]))
    put(case, "final_state", state_rows(captured["state"]))
    return {"hidden_size": hidden, "linear_num_heads": H, "linear_head_dim": d, "linear_conv_kernel_dim": 4,
            "rms_norm_eps": 1e-5, "L": L_LAYER, "exp_g_range": [alpha.min().item(), alpha.max().item()],
            "chunk_vs_recurrent_max_abs": [d_out, d_state], "stock_fp32_vs_fp64_rel": d_stock}


# --------------------------------------------------------------------------------------------
# c. fla's naive recurrences


def fla_module(rel, fn_name):
    mod = load_by_path(rel)
    ns = dict(vars(mod))
    return fp64_clone(getattr(mod, fn_name), ns)


def fla_naive_gdn(put, gen):
    f = fla_module("fla/ops/gated_delta_rule/naive.py", "naive_recurrent_gated_delta_rule")
    H, dk, dv, T = 3, 8, 6, L_NAIVE
    q = l2n(torch.randn(1, T, H, dk, generator=gen))
    k = l2n(torch.randn(1, T, H, dk, generator=gen))
    v = torch.randn(1, T, H, dv, generator=gen)
    beta = torch.rand(1, T, H, generator=gen)
    g = -torch.empty(1, T, H).uniform_(0.0, 1.0, generator=gen)  # exp(g) in (0.37, 1)
    scale = dk ** -0.5
    o, S = f(q, k, v, beta, g, scale=None, initial_state=None, output_final_state=True)  # scale None -> K^-0.5
    assert o.dtype == torch.float64
    c = "fla_naive_gdn"
    put(c, "q", tokens_heads(q)); put(c, "k", tokens_heads(k)); put(c, "v", tokens_heads(v))
    put(c, "beta", np64(beta[0])); put(c, "g", np64(g[0])); put(c, "scale", scale)
    put(c, "o", tokens_heads(o)); put(c, "final_state", state_rows(S))
    return {"H": H, "dk": dk, "dv": dv, "L": T, "scale": scale}


def fla_naive_deltanet(put, gen):
    f = fla_module("fla/ops/delta_rule/naive.py", "delta_rule_recurrence")
    H, dk, dv, T = 2, 8, 6, L_NAIVE
    q = l2n(torch.randn(1, T, H, dk, generator=gen))
    k = l2n(torch.randn(1, T, H, dk, generator=gen))
    v = torch.randn(1, T, H, dv, generator=gen)
    beta = torch.rand(1, T, H, generator=gen)
    hf = lambda x: x.transpose(1, 2).contiguous()  # this function takes head-first [B, H, T, D]
    o, S = f(hf(q), hf(k), hf(v), hf(beta), initial_state=None, output_final_state=True)
    assert o.dtype == torch.float64
    o = o.transpose(1, 2)
    c = "fla_naive_deltanet"
    put(c, "q", tokens_heads(q)); put(c, "k", tokens_heads(k)); put(c, "v", tokens_heads(v))
    put(c, "beta", np64(beta[0])); put(c, "scale", dk ** -0.5)
    put(c, "o", tokens_heads(o)); put(c, "final_state", state_rows(S))
    return {"H": H, "dk": dk, "dv": dv, "L": T, "scale": dk ** -0.5}


def fla_naive_kda(put, gen):
    f = fla_module("fla/ops/kda/naive.py", "naive_recurrent_kda")
    H, HV, dk, dv, T = 2, 4, 8, 6, L_NAIVE  # grouped values: value head hv reads key head hv // (HV/H)
    q = l2n(torch.randn(1, T, H, dk, generator=gen))
    k = l2n(torch.randn(1, T, H, dk, generator=gen))
    v = torch.randn(1, T, HV, dv, generator=gen)
    beta = torch.rand(1, T, HV, generator=gen)
    g = -torch.empty(1, T, HV, dk).uniform_(0.0, 1.0, generator=gen)  # per key, log space
    o, S = f(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=True)
    assert o.dtype == torch.float64
    c = "fla_naive_kda"
    put(c, "q", tokens_heads(q)); put(c, "k", tokens_heads(k)); put(c, "v", tokens_heads(v))
    put(c, "beta", np64(beta[0])); put(c, "gk", tokens_heads(g)); put(c, "scale", dk ** -0.5)
    put(c, "o", tokens_heads(o)); put(c, "final_state", state_rows(S))
    return {"H": H, "HV": HV, "dk": dk, "dv": dv, "L": T, "scale": dk ** -0.5}


def fla_naive_dplr(put, gen):
    f = fla_module("fla/ops/generalized_delta_rule/dplr/naive.py", "dplr_recurrence")
    H, dk, dv, T = 2, 8, 6, L_NAIVE
    # RWKV-7-like coefficients: a = -kk, b = kk * a_sig with kk unit, log-decay in (-e^-1/2, 0)
    q = torch.randn(1, T, H, dk, generator=gen)
    k = torch.randn(1, T, H, dk, generator=gen) * 0.5
    v = torch.randn(1, T, H, dv, generator=gen)
    kk = l2n(torch.randn(1, T, H, dk, generator=gen))
    a_sig = torch.rand(1, T, H, dk, generator=gen)
    alpha, beta = -kk, kk * a_sig
    gk = -0.6065306597126334 * torch.rand(1, T, H, dk, generator=gen)
    hf = lambda x: x.transpose(1, 2).contiguous()
    o, S = f(hf(q), hf(k), hf(v), hf(alpha), hf(beta), hf(gk), initial_state=None, output_final_state=True)
    assert o.dtype == torch.float64
    o = o.transpose(1, 2)
    c = "fla_naive_dplr"
    put(c, "q", tokens_heads(q)); put(c, "k", tokens_heads(k)); put(c, "v", tokens_heads(v))
    put(c, "a", tokens_heads(alpha)); put(c, "b", tokens_heads(beta)); put(c, "gk", tokens_heads(gk))
    put(c, "scale", dk ** -0.5)
    put(c, "o", tokens_heads(o)); put(c, "final_state", state_rows(S))
    return {"H": H, "dk": dk, "dv": dv, "L": T, "scale": dk ** -0.5}


# --------------------------------------------------------------------------------------------
# d. fla's layers: RWKV7Attention, GatedDeltaProduct
#
# Every Triton call of these layers' forward is replaced at run time by fla's own torch path for
# it (the *_ref / naive functions shipped next to the kernels), patched to float64 where it casts.
# Three pieces have no torch counterpart in fla and are written here from the kernels' definitions
# (three lines each, see l2norm_torch and short_conv_torch): the in-kernel L2 norm and the
# ShortConvolution (which is an nn.Conv1d: its own torch forward is used).

TRITON_IMPORT_DIR = "triton-import-only"  # <venv>/triton-import-only, installed by setup_venv.sh


def import_fla(name):
    """Imports fla.<name>. fla's layer and module files import triton at the top (for kernels that
    never run here). setup_venv.sh keeps triton out of site-packages (with fla and triton both
    importable, transformers swaps fla's Triton kernels into the transformers cases' modules and
    into the project's own transformers tests) and installs it under <venv>/triton-import-only
    instead, which is put on sys.path only here, after the transformers cases have run."""
    if importlib.util.find_spec("triton") is None:
        d = os.path.join(sys.prefix, TRITON_IMPORT_DIR)
        if not os.path.isdir(os.path.join(d, "triton")):
            raise RuntimeError(f"{d} holds no triton; run bash tools/reference/setup_venv.sh")
        sys.path.append(d)
        importlib.invalidate_caches()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Triton is not supported on current platform, roll back to CPU"
        return importlib.import_module("fla." + name)


def l2norm_torch(x, eps=1e-6):
    """fla's l2norm (fla/modules/norm/l2norm.py, l2norm_fwd_kernel; also the use_qk_l2norm_in_kernel
    branch of the delta-rule kernels): x / sqrt(sum x^2 + eps) over the last dim. fla ships no torch
    version of it."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def short_conv_torch(conv):
    """ShortConvolution's forward through torch: the module is an nn.Conv1d (depthwise, padding K-1),
    so nn.Conv1d.forward on (B, D, T), the first T outputs (causal), then its SiLU activation."""
    def forward(x, residual=None, mask=None, cache=None, output_final_state=False, cu_seqlens=None, **kw):
        assert residual is None and mask is None and cache is None and cu_seqlens is None
        T = x.shape[1]
        y = torch.nn.Conv1d.forward(conv, x.transpose(1, 2))[..., :T].transpose(1, 2)
        if conv.activation is not None:
            y = torch.nn.functional.silu(y)
        return y, None
    return forward


def rwkv7_layer(put, gen, case, layer_idx, fuse_norm, value_dim):
    R = import_fla("layers.rwkv7")
    TS = import_fla("modules.token_shift")
    AC = import_fla("ops.rwkv7.fused_addcmul")
    KU = import_fla("ops.rwkv7.fused_k_update")
    GO = import_fla("ops.rwkv7.gate_output_correction")
    LN = import_fla("modules.norm.layernorm")
    dplr_stock = import_fla("ops.generalized_delta_rule.dplr.naive").dplr_recurrence
    dplr64 = fla_module("fla/ops/generalized_delta_rule/dplr/naive.py", "dplr_recurrence")
    group_norm64 = fp64_clone(LN.group_norm_ref, dict(vars(LN)))

    C, N, L = 32, 16, L_LAYER  # N = 16: dplr_recurrence's hard-coded q * N^-1/2 is undone exactly (x 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fla's "potentially buggy FLA implementation of RWKV" notice
        # fla's init of a layer > 0 fails when value_dim != hidden_size (v_lora.set_bias_value gets a
        # hidden_size-long vector): build such a layer with layer_idx=None, which skips that init (every
        # parameter is drawn below) but creates v_lora (layer_idx != 0), and set the index after.
        skip_init = layer_idx > 0 and value_dim not in (None, C)
        mix = R.RWKV7Attention(mode="chunk", hidden_size=C, head_dim=N, decay_low_rank_dim=8, gate_low_rank_dim=12,
                               a_low_rank_dim=8, v_low_rank_dim=6, norm_eps=1e-5,
                               layer_idx=None if skip_init else layer_idx, fuse_norm=fuse_norm, value_dim=value_dim,
                               num_hidden_layers=2).double().eval()
        mix.layer_idx = layer_idx
    H, V = mix.num_heads, mix.value_dim
    with torch.no_grad():
        for name, p in mix.named_parameters():
            if name.startswith("x_"):                       # token-shift mixes
                p.copy_(torch.rand(p.shape, generator=gen))
            elif name in ("k_k", "k_a", "g_norm.weight"):
                p.copy_(torch.empty(p.shape).uniform_(0.5, 1.5, generator=gen))
            elif name.endswith("lora.2.bias"):              # w0, a0, v0
                p.copy_(torch.randn(p.shape, generator=gen))
            else:                                           # projections, LoRA weights, r_k, g_norm.bias
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)

    captured = {}

    def recurrence(dplr):
        # fla's op on [B, T, H, d] -> dplr_recurrence on head-first [B, H, T, d]. The fused op's
        # a, b are -kk, kk * a (fused_recurrent_rwkv7_fwd_kernel: b_act_a = -b_kk, b_b = b_kk * b_a).
        def run(path, r, w, k, v, a, b, scale):
            hf = lambda x: x.transpose(1, 2).contiguous()
            q = r * (scale * r.shape[-1] ** 0.5)  # dplr_recurrence applies d_k^-1/2 to q itself
            args = [hf(x) for x in (q, k, v, a, b, w)]
            if dplr is dplr_stock:  # float32 inside; it casts all but alpha, which then cannot mix: cast it too
                args = [x.float() for x in args]
            o, S = dplr(*args, initial_state=None, output_final_state=True)
            captured.update(path=path, state=S, w=w)
            return o.transpose(1, 2).to(r.dtype)

        def fused_mul(r, w, k, v, kk, a, scale=1.0, initial_state=None, output_final_state=False, reverse=False,
                      cu_seqlens=None):
            assert initial_state is None and not reverse and cu_seqlens is None
            o = run("fused_mul_recurrent_rwkv7", r, w, k, v, -kk, kk * a, scale)
            captured["a_sig"] = a
            return o, (captured["state"] if output_final_state else None)

        def chunk(r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None, **kw):
            assert initial_state is None and cu_seqlens is None
            o = run("chunk_rwkv7", r, w, k, v, a, b, scale)
            return o, (captured["state"] if output_final_state else None)
        return fused_mul, chunk

    def token_shift(x, cu_seqlens=None, cache=None, output_cache=False, chunk_indices=None):
        assert cu_seqlens is None and cache is None
        delta = TS.token_shift_ref(x)
        return (delta, None) if output_cache else delta  # the cache is unused without past_key_values

    # The layer reads these names from its module's globals at call time.
    R.token_shift = token_shift
    R.fused_addcmul_rwkv7 = AC.torch_addcmul_rwkv7
    R.fused_k_rwkv7 = lambda k, a, ka, cu_seqlens=None, cu_seqlens_cpu=None: KU.k_update_ref(k, a, ka)
    R.gate_output_correction = GO.gate_output_correction_ref
    R.l2_norm = l2norm_torch  # fuse_norm=True only
    if fuse_norm:  # fla's GroupNorm (Triton) -> its group_norm_ref; fuse_norm=False uses torch's nn.GroupNorm
        gn = mix.g_norm
        assert isinstance(gn, LN.GroupNorm) and not gn.is_rms_norm
        gn.forward = lambda x, residual=None, prenorm=False, residual_in_fp32=False: group_norm64(
            x, gn.weight, gn.bias, gn.num_groups, eps=gn.eps, is_rms_norm=False)
    else:
        assert type(mix.g_norm) is torch.nn.GroupNorm

    u = torch.randn(1, L, C, generator=gen)
    v_first_in = torch.randn(1, L, V, generator=gen) if layer_idx > 0 else None
    outs = {}
    for tag, dplr in (("stock", dplr_stock), ("fp64", dplr64)):
        R.fused_mul_recurrent_rwkv7, R.chunk_rwkv7 = recurrence(dplr)
        with torch.no_grad():
            out, _, _, v_first_out = mix(u, v_first=v_first_in)
        outs[tag] = out
    assert captured["path"] == "fused_mul_recurrent_rwkv7", captured["path"]  # eval, no grad, T < 64
    out = outs["fp64"]
    assert out.dtype == torch.float64 and captured["state"].dtype == torch.float64
    d_stock = (outs["stock"] - out).abs().max().item() / (1 + out.abs().max().item())
    assert d_stock < 1e-4, d_stock

    for name, p in mix.state_dict().items():
        a = np64(p)
        if name.startswith("x_"):
            a = a.reshape(-1)  # (1, 1, C) -> (C,)
        put(case, name.replace(".", "_"), a)
    put(case, "u", np64(u[0]))
    put(case, "v_first", np64((v_first_in if layer_idx > 0 else v_first_out)[0]))
    put(case, "out", np64(out[0]))
    put(case, "final_state", state_rows(captured["state"]))
    w = captured["w"]
    return {"hidden_size": C, "head_dim": N, "num_heads": H, "value_dim": V, "layer_idx": layer_idx,
            "num_hidden_layers": 2, "fuse_norm": fuse_norm, "decay_low_rank_dim": 8, "a_low_rank_dim": 8,
            "v_low_rank_dim": 6, "gate_low_rank_dim": 12, "norm_eps": 1e-5, "L": L, "path": captured["path"],
            "exp_w_range": [w.exp().min().item(), w.exp().max().item()],
            "a_range": [captured["a_sig"].min().item(), captured["a_sig"].max().item()],
            "stock_fp32_vs_fp64_rel": d_stock}


def fla_rwkv7_layer(put, gen):
    """Layer 0, fuse_norm=True (the RWKV7Config default of fla-hub's checkpoints): fla's GroupNorm
    with bias and its l2_norm; v_first is the layer's returned v."""
    return rwkv7_layer(put, gen, "fla_rwkv7_layer", layer_idx=0, fuse_norm=True, value_dim=None)


def fla_rwkv7_layer_v_first(put, gen):
    """Layer 1 of 2, fuse_norm=False (the layer's own default: torch's nn.GroupNorm and F.normalize),
    value_dim 24 != hidden 32, given v_first (the value residual through v_lora)."""
    return rwkv7_layer(put, gen, "fla_rwkv7_layer_v_first", layer_idx=1, fuse_norm=False, value_dim=24)


def fla_gated_deltaproduct_layer(put, gen):
    P = import_fla("layers.gated_deltaproduct")
    LG = import_fla("modules.norm.layernorm_gated")
    dp_stock = import_fla("ops.gated_delta_product.naive").naive_recurrent_gated_delta_product
    dp64 = fla_module("fla/ops/gated_delta_product/naive.py", "naive_recurrent_gated_delta_product")
    gdn64 = fla_module("fla/ops/gated_delta_rule/naive.py", "naive_recurrent_gated_delta_rule")
    rms_gated64 = fp64_clone(LG.rms_norm_ref, dict(vars(LG)))

    hidden, H, HV, dk, n, L = 24, 2, 4, 8, 2, L_LAYER
    mix = P.GatedDeltaProduct(hidden_size=hidden, expand_v=0.75, head_dim=dk, num_heads=H, num_v_heads=HV,
                              mode="chunk", use_output_gate=True, use_short_conv=True, conv_size=4, conv_bias=False,
                              layer_idx=0, norm_eps=1e-5, use_forget_gate=True, allow_neg_eigval=True,
                              num_householder=n).double().eval()
    dv = mix.head_v_dim
    with torch.no_grad():
        for name, p in mix.named_parameters():
            if name == "A_log":        # exp(A_log) in (0.08, 0.35), as the transformers cases
                p.copy_(torch.empty(p.shape).uniform_(0.08, 0.35, generator=gen).log())
            elif name == "dt_bias":
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif name == "o_norm.weight":
                p.copy_(torch.empty(p.shape).uniform_(0.5, 1.5, generator=gen))
            else:                      # projections and the three conv weights
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    for conv in (mix.q_conv1d, mix.k_conv1d, mix.v_conv1d):
        conv.forward = short_conv_torch(conv)
    onorm = mix.o_norm  # FusedRMSNormGated(activation='swish') -> fla's rms_norm_ref(z=g, norm_before_gate)
    assert onorm.activation in ("swish", "silu") and onorm.bias is None
    captured = {}

    def chunk_op(naive):
        # chunk_gated_delta_product(q, k, v, g, beta, num_householder, use_qk_l2norm_in_kernel=True):
        # the op's own naive recurrence, on q, k L2-normalised as the kernel does.
        def f(q, k, v, g, beta, num_householder, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kw):
            assert initial_state is None and cu_seqlens is None and use_qk_l2norm_in_kernel
            scale = k.shape[-1] ** -0.5 if scale is None else scale
            o, S = naive(l2norm_torch(q), l2norm_torch(k), v, g, beta, scale, initial_state=None, output_final_state=True,
                         num_householder=num_householder)
            captured.update(path="chunk_gated_delta_product", state=S, g=g, beta=beta)
            return o, (S if output_final_state else None)
        return f

    def fused_recurrent(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
                        cu_seqlens=None, use_qk_l2norm_in_kernel=False, **kw):
        # the layer's other path: the gated delta rule over the n*T sub-steps -> fla's naive GDN
        assert initial_state is None and cu_seqlens is None and use_qk_l2norm_in_kernel
        o, S = gdn64(l2norm_torch(q), l2norm_torch(k), v, beta, g, scale=scale, initial_state=None, output_final_state=True)
        captured.update(path_recurrent="fused_recurrent_gated_delta_rule", state_recurrent=S)
        return o, (S if output_final_state else None)

    u = torch.randn(1, L, hidden, generator=gen)
    forward_stock = P.GatedDeltaProduct.forward
    ns = dict(vars(P))
    forward64 = fp64_clone(P.GatedDeltaProduct.forward, ns)  # A_log.float(), a_proj(.).float()
    outs = {}
    for tag, fwd, naive, rms in (("stock", forward_stock, dp_stock, LG.rms_norm_ref),
                                 ("fp64", forward64, dp64, rms_gated64)):
        P.GatedDeltaProduct.forward = fwd
        P.chunk_gated_delta_product = ns["chunk_gated_delta_product"] = chunk_op(naive)
        onorm.forward = (lambda rms_: lambda x, g, residual=None, prenorm=False, residual_in_fp32=False: rms_(
            x, onorm.weight, None, z=g, eps=onorm.eps, norm_before_gate=True))(rms)
        with torch.enable_grad():  # grad enabled -> the layer's chunk mode
            outs[tag] = mix(u)[0].detach()
    assert captured["path"] == "chunk_gated_delta_product"
    out, state = outs["fp64"], captured["state"]
    assert out.dtype == torch.float64 and state.dtype == torch.float64
    d_stock = (outs["stock"] - out).abs().max().item() / (1 + out.abs().max().item())
    assert d_stock < 1e-4, d_stock
    # self-check: the layer's fused_recurrent mode (no grad, T <= 64) through fla's naive GDN
    ns["fused_recurrent_gated_delta_rule"] = fused_recurrent
    with torch.no_grad():
        out_rec = mix(u)[0]
    d_paths = (out_rec - out).abs().max().item()
    d_state = (captured["state_recurrent"] - state).abs().max().item()
    assert d_paths < 1e-10 and d_state < 1e-10, (d_paths, d_state)

    case = "fla_gated_deltaproduct_layer"
    for name, p in mix.state_dict().items():
        a = np64(p)
        if name.endswith("conv1d.weight"):
            a = a[:, 0, :]  # (D, 1, K) -> (D, K)
        put(case, name.replace(".", "_"), a)
    put(case, "u", np64(u[0]))
    put(case, "out", np64(out[0]))
    put(case, "final_state", state_rows(state))
    g, beta = captured["g"], captured["beta"]
    return {"hidden_size": hidden, "num_heads": H, "num_v_heads": HV, "head_dim": dk, "expand_v": 0.75,
            "head_v_dim": dv, "num_householder": n, "conv_size": 4, "norm_eps": 1e-5, "allow_neg_eigval": True,
            "use_forget_gate": True, "use_output_gate": True, "use_short_conv": True, "L": L,
            "exp_g_range": [g.exp().min().item(), g.exp().max().item()],
            "beta_range": [beta.min().item(), beta.max().item()],
            "chunk_vs_recurrent_max_abs": [d_paths, d_state], "stock_fp32_vs_fp64_rel": d_stock}


# --------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join("tests", "data", "reference"))
    ap.add_argument("--seed", type=int, default=20261)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    put = Writer(args.out)
    cases = [("qwen3_next_layer", qwen3_next_case), ("kimi_linear_layer", kimi_linear_case),
             ("fla_naive_gdn", fla_naive_gdn), ("fla_naive_deltanet", fla_naive_deltanet),
             ("fla_naive_kda", fla_naive_kda), ("fla_naive_dplr", fla_naive_dplr),
             ("fla_rwkv7_layer", fla_rwkv7_layer), ("fla_rwkv7_layer_v_first", fla_rwkv7_layer_v_first),
             ("fla_gated_deltaproduct_layer", fla_gated_deltaproduct_layer)]
    info = {}
    for i, (name, fn) in enumerate(cases):
        gen = torch.Generator().manual_seed(args.seed + i)  # one stream per case: cases are independent
        info[name] = fn(put, gen)
        info[name]["arrays"] = put.sizes[name]
        print(f"{name}: {json.dumps({k: v for k, v in info[name].items() if k != 'arrays'})}")
    pkgs = ["torch", "transformers", "flash-linear-attention", "fla-core", "einops", "numpy", "triton"]
    versions = {}
    for p in pkgs:
        try:
            versions[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            versions[p] = None
    meta = {"generator": "tools/reference/make_fixtures.py", "seed": args.seed,
            "date": datetime.date.today().isoformat(), "python": platform.python_version(),
            "packages": versions, "dtype": "float64", "cases": info}
    with open(os.path.join(args.out, "versions.json"), "w") as fh:
        json.dump(meta, fh, indent=1, sort_keys=True)
        fh.write("\n")
    print("wrote", args.out, json.dumps(versions))


if __name__ == "__main__":
    sys.exit(main())
