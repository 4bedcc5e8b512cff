#!/usr/bin/env python3
"""iattn against PyTorch on identical inputs: a Mamba-1 layer's holistic attention matrix.

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
"""
import argparse
import json
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
    mask = torch.ones(L, L, dtype=torch.bool).tril()
    S = (torch.exp(seg.masked_fill_(~mask, float("-inf"))) * CB).sum(1)  # (Dc, L, L)
    S *= dt[:, c0:c1].T[:, None, :]
    S.diagonal(dim1=-2, dim2=-1).add_(Dskip[0, c0:c1, None])
    S *= g[:, c0:c1].T[:, :, None]
    S *= sig[:, c0:c1].T[:, None, :]
    return conv_columns(S, w[:, c0:c1])


def torch_materialize_mean(inp):
    L, D, N = inp["g"].shape[0], inp["g"].shape[1], inp["A"].shape[1]
    chunk = max(1, min(D, (64 << 20) // (4 * N * L * L)))
    acc = torch.zeros(L, L)
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
    row = torch.zeros(g.shape[1], g.shape[0])
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
    h = torch.zeros(D, A.shape[1])
    y = torch.empty(L, D)
    for t in range(L):
        h = torch.exp(dt[t, :, None] * A) * h + (dt[t] * u[t])[:, None] * B[t][None, :]
        y[t] = g[t] * (h @ C[t] + Dskip[0] * u[t])
    return y


def rel_diff(a, b):
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / (1.0 + b.abs().max()))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", default="build-bench/bench/iattn_compare")
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tolerance", type=float, default=1e-3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
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
