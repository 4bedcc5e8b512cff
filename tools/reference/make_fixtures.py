#!/usr/bin/env python3
"""Writes the reference cross-check fixtures under tests/data/reference/ (see its README.md).

Run from the repository root, in the venv made by tools/reference/setup_venv.sh:

    .venv/bin/python tools/reference/make_fixtures.py [--out tests/data/reference] [--seed 20261]

Every case runs the reference implementation itself (transformers' layer modules, fla's naive
recurrences), on CPU, in float64. Where a reference casts to float32 internally, the function is
re-created at run time from its own installed source with the float32 casts replaced by float64
(`fp64_clone`: inspect.getsource + exec); nothing of the references' code is copied into this file.
Fixtures are float64 .npy files in C order; the C++ test tests/models/reference_test.cpp reads them.
"""

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
    exec(compile(new, f"<fp64 {fn.__module__}.{fn.__qualname__}>", "exec"), ns)
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join("tests", "data", "reference"))
    ap.add_argument("--seed", type=int, default=20261)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    put = Writer(args.out)
    cases = [("qwen3_next_layer", qwen3_next_case), ("kimi_linear_layer", kimi_linear_case),
             ("fla_naive_gdn", fla_naive_gdn), ("fla_naive_deltanet", fla_naive_deltanet),
             ("fla_naive_kda", fla_naive_kda), ("fla_naive_dplr", fla_naive_dplr)]
    info = {}
    for i, (name, fn) in enumerate(cases):
        gen = torch.Generator().manual_seed(args.seed + i)  # one stream per case: cases are independent
        info[name] = fn(put, gen)
        info[name]["arrays"] = put.sizes[name]
        print(f"{name}: {json.dumps({k: v for k, v in info[name].items() if k != 'arrays'})}")
    pkgs = ["torch", "transformers", "flash-linear-attention", "fla-core", "einops", "numpy"]
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
