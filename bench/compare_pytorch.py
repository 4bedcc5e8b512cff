#!/usr/bin/env python3
"""iattn against PyTorch on identical inputs: a Mamba-1 layer's holistic attention matrix (default),
or Gated DeltaNet's per-head matrix against fla's PyTorch references (--model gdn, below).

    H = diag(g) (S diag(dt) + diag(Dskip)) diag(sig) conv(w),   S[t, s] = sum_n C_t[n] exp(sum_{k=s+1..t} dt_k A[n]) B_s[n]

per channel, D = 1536, N = 16, K = 4, float32. For each length, build/bench/iattn_compare draws the
inputs, evaluates them with iattn, and exchanges inputs and outputs as .npy; this script evaluates
the same outputs with the papers' PyTorch formulation, checks that they agree, times both in this
one run, and prints a ratio table.

PyTorch formulations (the strongest vectorised form of the papers' approach we could write):
  materialize_mean, materialize: cumulative sums of dt*A, the (Dc, N, L, L) tensor
      exp(cum_t - cum_s) masked to s <= t, in channel chunks of 64 MiB (faster here than 1 GiB ones, which spend their time in page faults), times the
      shared C_t B_s outer product and summed over N; diagonals as broadcasts; the convolution as
      K shifted adds (cheaper than the papers' dense conv matrix and batched matmul).
  row: the loop-free form for one row, exp(cum_t - cum_s) over (D, N, L), summed over N.
  apply: the sequential selective scan (mamba_ssm's selective_scan_ref), one step per token.

    apt-get install python3-torch libopenblas0-pthread
    python3 bench/compare_pytorch.py --tool build-bench/bench/iattn_compare [--lengths 256 1024]

--model gdn: Gated DeltaNet at Qwen3-Next's head shape (dk = dv = 128), H = 4 heads, float32,
    H_h[t, s] = q_t^T A_t ... A_{s+1} beta_s k_s,   A_t = e^{g_t} (I - beta_t k_t k_t^T),
with q, k L2-normalised per head (q pre-scaled by dk^-1/2 by the tool, so scale = 1 below),
beta in (0, 1), decays e^g in (0.9, 1). `iattn_compare --model gdn` draws and evaluates them;
this script runs fla's own PyTorch references on the same .npy inputs, loaded by file path from
the installed fla-core (fla/ops/gated_delta_rule/naive.py imports only torch and einops, so it
works on a CPU-only machine with or without triton):
  apply: fla's naive_chunk_gated_delta_rule (chunk 64, the WY/UT-transform chunk form: the
      strongest PyTorch formulation fla ships) and naive_recurrent_gated_delta_rule (one step per
      token), on [B=1, T, H, 128]; both checked against iattn's y.
  materialize (head 0, L x L): our chunked form of the same algebra, per chunk of C tokens
      (default 128; cumulative log-gates gamma, Gamma[i, j] = exp(gamma_i - gamma_j) for j <= i)
        T  = (I + strict_lower(diag(beta) K K^T * Gamma))^-1     (the UT transform, one batched
                                                                   triangular solve, not fla's loop)
        U  = T diag(beta), W = T (beta k e^gamma), P = lower(Q K^T * Gamma)
        diagonal block  P U;   block row below: (Q e^gamma - P W) S_i[:, :iC]
        S_{i+1}[:, :iC] = (e^{gamma_last} I - Kd^T W) S_i[:, :iC],  S_{i+1}[:, chunk i] = Kd^T U,
        Kd = K e^{gamma_last - gamma},
      i.e. fla's chunk recurrence run on the identity as values, restricted to the columns s < t
      that are non-zero: O(L^2 dk (1 + dk / C)) multiply-adds in matmuls, no L x L x dk temporaries.
  row (t = L - 1, all heads): the same within-chunk quantities (U, W, Kd), then the row's K-vector
      propagated backwards over chunks (row chunk j = (r Kd_j^T) U_j, r <- e^{gamma_last} r -
      (r Kd_j^T) W_j: vector-matrix products, nothing K x K), batched over heads.
Agreement: max |difference| / max |value| <= 1e-3 for every output. The gdn mode sets
torch.set_flush_denormal(True) (--no-flush-denormal to keep denormals): about 4 % of the L = 4096
matrix lies below 1.2e-38, and the chunked row runs about twice as fast with them flushed.

The gdn mode needs torch + fla-core, i.e. the reference venv (tools/reference/setup_venv.sh; the
mamba1 mode keeps using /usr/bin/python3 with Debian's torch):

    bash tools/reference/setup_venv.sh
    .venv/bin/python bench/compare_pytorch.py --model gdn --tool build-bench/bench/iattn_compare \
        [--lengths 1024 4096] [--threads 2] [--reps 3]
"""
import argparse
import importlib.util
import json
import platform
import os
import subprocess
import tempfile
import time

import numpy as np
import torch


def load(d, name):
    return torch.from_numpy(np.load(os.path.join(d, name + ".npy")))


def best(f, reps):
    out, t = None, float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        out = f()
        t = min(t, time.perf_counter() - t0)
    return out, t


def conv_columns(M, taps):
    """M (Dc, L, L) times each channel's causal convolution matrix: sum_lag M[:, t, s'+lag] w[K-1-lag]."""
    K, L = taps.shape[0], M.shape[-1]
    out = M * taps[K - 1].view(-1, 1, 1)
    for lag in range(1, min(K, L)):
        out[:, :, : L - lag] += M[:, :, lag:] * taps[K - 1 - lag].view(-1, 1, 1)
    return out


def holistic(inp, c0, c1):
    """Channels [c0, c1) of H, as a (c1 - c0, L, L) tensor."""
    g, dt, A, B, C, sig, w, Dskip, CB = (inp[k] for k in ("g", "dt", "A", "B", "C", "sig", "w", "Dskip", "CB"))
    L = g.shape[0]
    cum = torch.cumsum(dt[:, c0:c1, None] * A[None, c0:c1, :], dim=0).permute(1, 2, 0)  # (Dc, N, L)
    seg = cum[..., :, None] - cum[..., None, :]  # (Dc, N, L, L): sum_{k=s+1..t}
    mask = torch.ones(L, L, dtype=torch.bool, device=g.device).tril()
    S = (torch.exp(seg.masked_fill_(~mask, float("-inf"))) * CB).sum(1)  # (Dc, L, L)
    S *= dt[:, c0:c1].T[:, None, :]
    S.diagonal(dim1=-2, dim2=-1).add_(Dskip[0, c0:c1, None])
    S *= g[:, c0:c1].T[:, :, None]
    S *= sig[:, c0:c1].T[:, None, :]
    return conv_columns(S, w[:, c0:c1])


def torch_materialize_mean(inp, budget=64 << 20):
    """The channel mean, channels in chunks whose (Dc, N, L, L) tensor takes about `budget` bytes."""
    L, D, N = inp["g"].shape[0], inp["g"].shape[1], inp["A"].shape[1]
    chunk = max(1, min(D, budget // (inp["g"].element_size() * N * L * L)))
    acc = torch.zeros(L, L, dtype=inp["g"].dtype, device=inp["g"].device)
    for c0 in range(0, D, chunk):
        acc += holistic(inp, c0, min(D, c0 + chunk)).sum(0)
    return acc / D


def torch_row(inp, t):
    g, dt, A, B, C, sig, w, Dskip = (inp[k] for k in ("g", "dt", "A", "B", "C", "sig", "w", "Dskip"))
    cum = torch.cumsum(dt[: t + 1, :, None] * A[None], dim=0)  # (t+1, D, N)
    E = torch.exp(cum[t][None] - cum)  # (t+1, D, N): sum_{k=s+1..t}
    S = torch.einsum("n,sdn,sn->ds", C[t], E, B[: t + 1])  # (D, t+1)
    S *= dt[: t + 1].T
    S[:, t] += Dskip[0]
    S *= g[t][:, None] * sig[: t + 1].T
    K = w.shape[0]
    out = S * w[K - 1][:, None]
    for lag in range(1, min(K, t + 1)):
        out[:, : t + 1 - lag] += S[:, lag:] * w[K - 1 - lag][:, None]
    row = torch.zeros(g.shape[1], g.shape[0], dtype=g.dtype, device=g.device)
    row[:, : t + 1] = out
    return row


def torch_apply(inp):
    x, g, dt, A, B, C, sig, w, Dskip = (inp[k] for k in ("x", "g", "dt", "A", "B", "C", "sig", "w", "Dskip"))
    L, D = x.shape
    K = w.shape[0]
    xc = x * w[K - 1]
    for lag in range(1, min(K, L)):
        xc[lag:] += x[:-lag] * w[K - 1 - lag]
    u = sig * xc
    h = torch.zeros(D, A.shape[1], dtype=x.dtype, device=x.device)
    y = torch.empty(L, D, dtype=x.dtype, device=x.device)
    for t in range(L):
        h = torch.exp(dt[t, :, None] * A) * h + (dt[t] * u[t])[:, None] * B[t][None, :]
        y[t] = g[t] * (h @ C[t] + Dskip[0] * u[t])
    return y


def rel_diff(a, b):
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / (1.0 + b.abs().max()))


# ---------------------------------------------------------------------------------------------
# --model gdn


def load_fla_naive():
    """fla/ops/gated_delta_rule/naive.py of the installed fla-core, loaded by file path (importing
    fla.ops would import the Triton kernels)."""
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("--model gdn needs fla-core (and torch) installed: run tools/reference/setup_venv.sh "
                         "and use .venv/bin/python (fla's naive references are loaded from the installed package)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "ops", "gated_delta_rule", "naive.py")
    if not os.path.exists(path):
        raise SystemExit(f"fla is installed but {path} is missing; tools/reference/setup_venv.sh pins fla-core 0.6.0")
    mspec = importlib.util.spec_from_file_location("fla_gdn_naive", path)
    m = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(m)
    import fla
    return m, getattr(fla, "__version__", "?"), path


def gdn_chunk_parts(q, k, beta, g, C):
    """The within-chunk quantities of the chunk form, batched over leading dims: q, k (..., L, K),
    beta, g (..., L), L a multiple of C. Returns, each with a chunk dim n after the leading ones,
    q e^gamma (n, C, K), P (n, C, C) = lower(Q K^T * Gamma), U (n, C, C) = T diag(beta),
    W (n, C, K) = T (beta k e^gamma), Kd (n, C, K) = k e^{gamma_last - gamma}, e^{gamma_last} (n, 1)."""
    *lead, L, K = q.shape
    n = L // C
    q, k = q.reshape(*lead, n, C, K), k.reshape(*lead, n, C, K)
    beta, g = beta.reshape(*lead, n, C), g.reshape(*lead, n, C)
    gam = g.cumsum(-1)
    low = torch.ones(C, C, dtype=torch.bool).tril()
    Gam = torch.exp((gam[..., :, None] - gam[..., None, :]).masked_fill(~low, float("-inf")))  # lower incl. diag
    kb = k * beta[..., None]
    eye = torch.eye(C)
    Astr = (kb @ k.transpose(-1, -2) * Gam).tril(-1)
    T = torch.linalg.solve_triangular(eye + Astr, eye.expand_as(Astr), upper=False, unitriangular=True)
    eg = gam.exp()[..., None]
    glast = gam[..., -1:]
    return q * eg, q @ k.transpose(-1, -2) * Gam, T * beta[..., None, :], T @ (kb * eg), k * (glast - gam).exp()[..., None], glast.exp()


def pad_to(x, L, dim):
    if x.shape[dim] == L:
        return x
    shape = list(x.shape)
    shape[dim] = L - x.shape[dim]
    return torch.cat([x, x.new_zeros(shape)], dim)  # zero k, q, beta, g: padded tokens change nothing before them


def gdn_materialize(q, k, beta, g, C):
    """One head's L x L matrix; q, k (L, K), beta, g (L,)."""
    L0, K = q.shape
    L = -(-L0 // C) * C
    q, k, beta, g = pad_to(q, L, 0), pad_to(k, L, 0), pad_to(beta, L, 0), pad_to(g, L, 0)
    qe, P, U, W, Kd, elast = gdn_chunk_parts(q, k, beta, g, C)
    Qp = qe - P @ W                                                           # (n, C, K)
    A = elast[..., None] * torch.eye(K) - Kd.transpose(-1, -2) @ W           # (n, K, K) chunk transitions
    B = Kd.transpose(-1, -2) @ U                                              # (n, K, C)
    PU = P @ U                                                                # (n, C, C) diagonal blocks
    n = L // C
    M = torch.zeros(L, L)
    S, S2 = torch.empty(K, L), torch.empty(K, L)  # the state on the identity columns, double-buffered
    for i in range(n):
        r = slice(i * C, (i + 1) * C)
        M[r, r] = PU[i]
        if i > 0:
            torch.mm(Qp[i], S[:, : i * C], out=M[r, : i * C])
        if i + 1 < n:
            if i > 0:
                torch.mm(A[i], S[:, : i * C], out=S2[:, : i * C])
                S, S2 = S2, S
            S[:, r] = B[i]
    return M[:L0, :L0]


def gdn_row(q, k, beta, g, C):
    """Row L - 1 of every head's matrix, (H, L); q, k (H, L, K), beta, g (H, L). Backwards over
    chunks with a K-vector r (the row's state): chunk j's entries are (r Kd_j^T) U_j, then
    r <- r A_j = e^{gamma_last} r - (r Kd_j^T) W_j; nothing K x K is formed."""
    Hh, L0, K = q.shape
    L = -(-L0 // C) * C
    pad = L - L0
    if pad:  # zero tokens in front: zero columns, and A = I for them (beta = 0, g = 0)
        z = lambda x: torch.cat([x.new_zeros(*x.shape[:1], pad, *x.shape[2:]), x], 1)
        q, k, beta, g = z(q), z(k), z(beta), z(g)
    qe, P, U, W, Kd, elast = gdn_chunk_parts(q, k, beta, g, C)
    n = L // C
    row = torch.empty(Hh, L)
    p = P[:, n - 1, -1:]                                   # (H, 1, C): the last token's row of P
    row[:, (n - 1) * C :] = (p @ U[:, n - 1])[:, 0]
    r = qe[:, n - 1, -1:] - p @ W[:, n - 1]                # (H, 1, K)
    for j in range(n - 2, -1, -1):
        x = r @ Kd[:, j].transpose(-1, -2)                 # (H, 1, C)
        row[:, j * C : (j + 1) * C] = (x @ U[:, j])[:, 0]
        if j > 0:
            r = elast[:, j, None] * r - x @ W[:, j]
    return row[:, pad:]


def rel_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max())


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def main_gdn(args):
    naive, fla_version, fla_path = load_fla_naive()
    # Entries decay through the float32 denormal range (products of up to L gates e^g < 1; about 4 %
    # of the L = 4096 matrix is below 1.2e-38); flushing them to zero makes PyTorch's chunked row about
    # twice as fast here, and changes nothing above 1e-38. iattn does not flush.
    flush = not args.no_flush_denormal and torch.set_flush_denormal(True)
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs; torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"fla-core {fla_version} ({fla_path}); torch flush_denormal {bool(flush)}; iattn tool {args.tool}")
    # Warm-up on small random inputs: torch's first calls pay one-off initialisation (seconds here)
    # that would otherwise land in the single timed call of the slow cases.
    with torch.inference_mode():
        Lw, Hw = 2 * max(args.chunk, args.row_chunk, 64), args.heads
        qw, kw = (torch.nn.functional.normalize(torch.randn(1, Lw, Hw, 128), dim=-1) for _ in range(2))
        vw, bw, gw = torch.randn(1, Lw, Hw, 128), torch.rand(1, Lw, Hw), -0.05 * torch.rand(1, Lw, Hw)
        naive.naive_chunk_gated_delta_rule(qw, kw, vw, gw, bw, scale=1.0)
        naive.naive_recurrent_gated_delta_rule(qw, kw, vw, bw, gw, scale=1.0)
        qt, kt, bt, gt = qw[0].transpose(0, 1), kw[0].transpose(0, 1), bw[0].T, gw[0].T
        gdn_materialize(qt[0], kt[0], bt[0], gt[0], args.chunk)
        gdn_row(qt, kt, bt, gt, args.row_chunk)
    rows, ok = [], True
    for L in args.lengths:
        with tempfile.TemporaryDirectory() as d:
            cmd = [args.tool, "--model", "gdn", d, str(L), str(args.reps), str(args.heads)]
            res = subprocess.run(cmd, check=True, capture_output=True, text=True)
            it = json.loads(res.stdout.strip().splitlines()[-1])
            inp = {k: load(d, k) for k in ("q", "k", "v", "beta", "g")}
            ref = {k: load(d, k) for k in ("apply", "materialize", "row")}
        H, K, V = it["H"], it["dk"], it["dv"]
        q4, k4, v4 = (inp[n].view(1, L, H, -1) for n in ("q", "k", "v"))  # [B, T, H, K], head-major columns
        b3, g3 = inp["beta"].view(1, L, H), inp["g"].view(1, L, H)
        qh, kh = q4[0].transpose(0, 1).contiguous(), k4[0].transpose(0, 1).contiguous()  # (H, L, K)
        bh, gh = b3[0].T.contiguous(), g3[0].T.contiguous()  # (H, L)
        y_ref = ref["apply"]
        heavy = args.reps if L <= 1024 else 1
        cases = [
            ("apply vs fla naive_chunk", lambda: naive.naive_chunk_gated_delta_rule(q4, k4, v4, g3, b3, scale=1.0)[0]
             .reshape(L, H * V), it["apply"], y_ref, args.reps),
            ("apply vs fla naive_recurrent", lambda: naive.naive_recurrent_gated_delta_rule(q4, k4, v4, b3, g3, scale=1.0)[0]
             .reshape(L, H * V), it["apply"], y_ref, heavy),
            (f"materialize (head 0) vs chunked C={args.chunk}",
             lambda: gdn_materialize(qh[0], kh[0], bh[0], gh[0], args.chunk), it["materialize"], ref["materialize"], args.reps),
            (f"row L-1 (all heads) vs chunked C={args.row_chunk}",
             lambda: gdn_row(qh, kh, bh, gh, args.row_chunk), it["row_s"], ref["row"][::V], args.reps),
        ]
        with torch.inference_mode():
            for name, f, t_iattn, r, reps in cases:
                out, t_torch = best(f, reps)
                err = rel_err(out, r)
                ok &= err <= args.tolerance
                rows.append((L, name, t_iattn, t_torch, err))
                print(f"  L={L} {name}: iattn {t_iattn:.4g} s, torch {t_torch:.4g} s, x{t_torch / t_iattn:.1f}, "
                      f"rel err {err:.2e}", flush=True)
    print()
    print("| L | output | iattn | PyTorch | speed-up | max diff / max |")
    print("| --- | --- | --- | --- | --- | --- |")
    for L, name, ti, tt, err in rows:
        print(f"| {L} | {name} | {ti * 1e3:.3g} ms | {tt * 1e3:.4g} ms | **{tt / ti:.1f}×** | {err:.1e} |")
    if not ok:
        print(f"\nDISAGREEMENT above the tolerance {args.tolerance}")
        raise SystemExit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["mamba1", "gdn"], default="mamba1")
    ap.add_argument("--tool", default="build-bench/bench/iattn_compare")
    ap.add_argument("--lengths", type=int, nargs="+", default=None,
                    help="default 256 1024 (mamba1), 1024 4096 (gdn)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tolerance", type=float, default=1e-3)
    ap.add_argument("--heads", type=int, default=4, help="gdn: H heads of dk = dv = 128")
    ap.add_argument("--chunk", type=int, default=128, help="gdn: chunk size of the PyTorch materialize")
    ap.add_argument("--row-chunk", type=int, default=32, help="gdn: chunk size of the PyTorch row")
    ap.add_argument("--no-flush-denormal", action="store_true",
                    help="gdn: leave torch's denormal handling alone (by default torch.set_flush_denormal(True))")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    if args.lengths is None:
        args.lengths = [1024, 4096] if args.model == "gdn" else [256, 1024]
    if args.model == "gdn":
        return main_gdn(args)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; iattn tool {args.tool}")
    rows, ok = [], True
    for L in args.lengths:
        with tempfile.TemporaryDirectory() as d:
            res = subprocess.run([args.tool, d, str(L), str(args.reps)], check=True, capture_output=True, text=True)
            it = json.loads(res.stdout.strip().splitlines()[-1])
            inp = {k: load(d, k) for k in ("x", "g", "dt", "A", "B", "C", "sig", "w", "Dskip")}
            inp["CB"] = inp["C"].T[:, :, None] * inp["B"].T[:, None, :]  # (N, L, L), shared by every channel
            ref = {k: load(d, k) for k in ("apply", "materialize", "materialize_mean", "row")}
        c, t = it["channel"], it["row"]
        heavy = max(1, args.reps if L <= 256 else 1)
        cases = [
            ("materialize_mean", lambda: torch_materialize_mean(inp), it["materialize_mean"], heavy),
            ("materialize (one channel)", lambda: holistic(inp, c, c + 1)[0], it["materialize"], args.reps),
            ("row (all channels)", lambda: torch_row(inp, t), it["row_s"], args.reps),
            ("apply", lambda: torch_apply(inp), it["apply"], heavy),
        ]
        keys = ["materialize_mean", "materialize", "row", "apply"]
        for (name, f, t_iattn, reps), key in zip(cases, keys):
            out, t_torch = best(f, reps)
            diff = rel_diff(out, ref[key])
            ok &= diff <= args.tolerance
            rows.append((L, name, t_iattn, t_torch, diff))
            print(f"  L={L} {name}: iattn {t_iattn:.4g} s, torch {t_torch:.4g} s, x{t_torch / t_iattn:.1f}, diff {diff:.2e}",
                  flush=True)
    print()
    print(f"| L | output | iattn | PyTorch | speed-up | max diff / (1 + max) |")
    print(f"| --- | --- | --- | --- | --- | --- |")
    for L, name, ti, tt, diff in rows:
        print(f"| {L} | {name} | {ti * 1e3:.3g} ms | {tt * 1e3:.4g} ms | **{tt / ti:.0f}×** | {diff:.1e} |")
    if not ok:
        print(f"\nDISAGREEMENT above the tolerance {args.tolerance}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
