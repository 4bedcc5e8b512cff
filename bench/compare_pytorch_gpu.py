#!/usr/bin/env python3
"""iattn's CUDA backend against PyTorch on the same GPU and the same inputs: Mamba-1's chain

    H = diag(g) S diag(dt) conv(w),   S[t, s] = sum_n C_t[n] exp(sum_{k=s+1..t} dt_k A[n]) B_s[n]

per channel, D = 1536, N = 16, K = 4, float32 (the expression of bench/cuda_bench.cu; the CUDA backend
has no sums yet, so no D-skip term). For each length this script draws the inputs, writes them as
.npy, runs build-gpu/bench/iattn_cuda_compare on them (apply, one channel's materialize, one row of
it, and at L <= --mean-max-length the channel mean and every channel's matrix), times PyTorch's
formulations of the same outputs on the same GPU, checks both against a float64 evaluation of the
PyTorch formulation (untimed), and prints a table.

PyTorch formulations (bench/compare_pytorch.py's, run on the GPU; timed with CUDA events, best of
--reps after one untimed call; inputs resident on the GPU):
  apply, sequential   mamba_ssm's selective_scan_ref: one step per token, h = e^{dt A} h + dt u B.
  apply, chunked      the SSD-style chunked scan (chunk --chunk tokens): within a chunk the masked
                      (D, N, Q, Q) tensor exp(cum_t - cum_s), chunk-relative cumulative sums, no
                      positive exponent; between chunks the (D, N) state carried by a loop over chunks.
  materialize         one channel: the (N, L, L) tensor exp(cum_t - cum_s) masked, times C_t B_s, summed.
  row                 one channel's row L - 1: exp(cum_t - cum_s) over (t + 1, N).
  mean, all           the materialize form over channel chunks of about --budget bytes.
iattn's times: whole calls of the CUDA backend, which copy the expression's coefficients from host
memory on every call (docs/cuda.md), and the same calls with the coefficients kept on the device
(the kernels' time; PyTorch's inputs are on the device too).

    python3 bench/compare_pytorch_gpu.py --tool build-gpu/bench/iattn_cuda_compare [--lengths 1024 4096]

Exit status 1 when an iattn output differs from the float64 reference by more than --tolerance
(max |difference| / max |reference|); 0 with a message when no GPU is visible to PyTorch.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_pytorch import holistic, torch_apply, torch_materialize_mean, torch_row  # noqa: E402


def draw(L, D, N, K, seed):
    rng = np.random.default_rng(seed)
    f = np.float32
    inp = {
        "x": rng.standard_normal((L, D)).astype(f),
        "g": rng.standard_normal((L, D)).astype(f),
        "dt": (0.001 + 0.099 * rng.random((L, D))).astype(f),
        "A": -np.tile(np.arange(1, N + 1, dtype=f), (D, 1)),
        "B": rng.standard_normal((L, N)).astype(f),
        "C": rng.standard_normal((L, N)).astype(f),
        "w": rng.standard_normal((K, D)).astype(f),
    }
    return inp


def on_device(inp, dtype, device):
    """compare_pytorch's inputs: the chain has no gate after the convolution and no D-skip."""
    t = {k: torch.from_numpy(v).to(device=device, dtype=dtype) for k, v in inp.items()}
    t["sig"] = torch.ones_like(t["x"])
    t["Dskip"] = torch.zeros(1, t["x"].shape[1], dtype=dtype, device=device)
    return t


def with_cb(t):
    t = dict(t)
    t["CB"] = t["C"].T[:, :, None] * t["B"].T[:, None, :]  # (N, L, L)
    return t


def one_channel(t, c):
    """The inputs of channel c alone (every per-channel coefficient sliced)."""
    s = dict(t)
    for k in ("x", "g", "dt", "sig", "w"):
        s[k] = t[k][:, c : c + 1]
    s["A"], s["Dskip"] = t["A"][c : c + 1], t["Dskip"][:, c : c + 1]
    return s


def apply_chunked(t, Q, budget):
    """Mamba-1's y = H x by chunks of Q tokens (see the header)."""
    x, g, dt, A, B, C, sig, w, Dskip = (t[k] for k in ("x", "g", "dt", "A", "B", "C", "sig", "w", "Dskip"))
    L, D = x.shape
    N, K = A.shape[1], w.shape[0]
    xc = x * w[K - 1]
    for lag in range(1, min(K, L)):
        xc[lag:] += x[:-lag] * w[K - 1 - lag]
    u = sig * xc
    v = dt * u
    nc = -(-L // Q)
    pad = nc * Q - L
    if pad:  # dt = 0 (no decay) and v = 0 (no input) on padded tokens; their outputs are dropped
        z = lambda m: torch.cat([m, m.new_zeros(pad, m.shape[1])])
        dt, v, B, C = z(dt), z(v), z(B), z(C)
    cum = (dt.view(nc, Q, D, 1) * A).cumsum(1)  # (nc, Q, D, N), chunk-relative, <= 0
    cumT = cum.permute(0, 2, 3, 1)  # (nc, D, N, Q)
    Bc, Cc, vc = B.view(nc, Q, N), C.view(nc, Q, N), v.view(nc, Q, D)
    CB = Cc.transpose(1, 2)[..., :, None] * Bc.transpose(1, 2)[..., None, :]  # (nc, N, Q, Q): C_t[n] B_s[n]
    mask = torch.ones(Q, Q, dtype=torch.bool, device=x.device).tril()
    y = torch.empty(nc, Q, D, dtype=x.dtype, device=x.device)
    G = max(1, budget // (x.element_size() * D * N * Q * Q))
    for c0 in range(0, nc, G):
        sl = slice(c0, c0 + G)
        seg = cumT[sl][..., :, None] - cumT[sl][..., None, :]  # (G, D, N, Q, Q)
        M = (torch.exp(seg.masked_fill_(~mask, float("-inf"))) * CB[sl][:, None]).sum(2)  # (G, D, Q, Q)
        y[sl] = torch.einsum("gdts,gsd->gtd", M, vc[sl])
    last = cum[:, -1]  # (nc, D, N)
    hc = torch.einsum("cqdn,cqn,cqd->cdn", torch.exp(last[:, None] - cum), Bc, vc)  # each chunk's own state
    Ad = torch.exp(last)
    H0 = torch.empty(nc, D, N, dtype=x.dtype, device=x.device)
    h = torch.zeros(D, N, dtype=x.dtype, device=x.device)
    for j in range(nc):
        H0[j] = h
        h = Ad[j] * h + hc[j]
    y += torch.einsum("cqn,cqdn,cdn->cqd", Cc, torch.exp(cum), H0)
    return g * (y.reshape(nc * Q, D)[:L] + Dskip[0] * u)


def materialize_all(t, budget):
    L, D, N = t["g"].shape[0], t["g"].shape[1], t["A"].shape[1]
    chunk = max(1, min(D, budget // (t["g"].element_size() * N * L * L)))
    out = torch.empty(D, L, L, dtype=t["g"].dtype, device=t["g"].device)
    for c0 in range(0, D, chunk):
        out[c0 : c0 + chunk] = holistic(t, c0, min(D, c0 + chunk))
    return out


def cuda_best(f, reps):
    """Best-of-reps seconds of f() (CUDA events on the current stream; wall clock on the CPU), after one
    untimed call; returns the last output too."""
    out = f()
    if not torch.cuda.is_available():
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            out = f()
            best = min(best, time.perf_counter() - t0)
        return out, best
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(reps):
        start.record()
        out = f()
        stop.record()
        stop.synchronize()
        best = min(best, start.elapsed_time(stop) / 1e3)
    return out, best


def rel_err(a, ref):
    a, ref = a.double().to(ref.device), ref.double()
    return float((a - ref).abs().max() / ref.abs().max())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", default="build-gpu/bench/iattn_cuda_compare")
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--channels", type=int, default=1536)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--chunk", type=int, default=32, help="chunk length of PyTorch's chunked apply")
    ap.add_argument("--budget", type=int, default=1 << 30, help="bytes of PyTorch's largest temporary tensor")
    ap.add_argument("--mean-max-length", type=int, default=1024,
                    help="the channel mean and every channel's matrix at lengths up to this")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--cpu", action="store_true", help="run PyTorch on the CPU (to try the script without a GPU)")
    args = ap.parse_args()
    if not torch.cuda.is_available() and not args.cpu:
        print("compare_pytorch_gpu: PyTorch sees no CUDA device; nothing to compare")
        return 0
    dev = torch.device("cpu" if args.cpu else "cuda")
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    D, N, K = args.channels, 16, 4
    # The copy bandwidth PyTorch reaches on this GPU (bytes read + written), the floor of a pass.
    buf = torch.empty(1 << (28 if dev.type == "cuda" else 24), device=dev)
    dst = torch.empty_like(buf)
    _, t_copy = cuda_best(lambda: dst.copy_(buf), 10)
    copy_bw = 2 * buf.numel() * 4 / t_copy
    del buf, dst
    print(f"device: {name}; torch {torch.__version__}; device-to-device copy {copy_bw / 1e12:.2f} TB/s; tool {args.tool}")
    rows, ok = [], True
    for L in args.lengths:
        inp = draw(L, D, N, K, seed=L)
        c = D // 2
        what = ["apply", "materialize", "row"] + (["mean", "all"] if L <= args.mean_max_length else [])
        with tempfile.TemporaryDirectory() as d:
            for k, v in inp.items():
                np.save(os.path.join(d, k + ".npy"), v)
            res = subprocess.run([args.tool, d, str(args.reps), ",".join(what)], capture_output=True, text=True)
            if res.returncode != 0:
                print(res.stdout, res.stderr)
                raise SystemExit(f"{args.tool} failed with status {res.returncode}")
            it = json.loads(res.stdout.strip().splitlines()[-1])
            got = {k: torch.from_numpy(np.load(os.path.join(d, k + ".npy"))) for k in what}
        t32, t64 = on_device(inp, torch.float32, dev), on_device(inp, torch.float64, dev)
        ch64 = one_channel(t64, c)
        all_idx = torch.tensor([0, c, D - 1], device=dev)
        cases = {
            "apply": [("sequential", lambda t: torch_apply(t)),
                      (f"chunked Q={args.chunk}", lambda t: apply_chunked(t, args.chunk, args.budget))],
            "materialize": [("dense", lambda t: holistic(with_cb(one_channel(t, c)), 0, 1)[0])],
            "row": [("dense", lambda t: torch_row(one_channel(t, c), L - 1)[0])],
            "mean": [("dense, channel chunks", lambda t: torch_materialize_mean(with_cb(t), args.budget))],
            "all": [("dense, channel chunks", lambda t: materialize_all(with_cb(t), args.budget))],
        }
        refs = {
            "apply": lambda: apply_chunked(t64, args.chunk, args.budget),
            "materialize": lambda: holistic(with_cb(ch64), 0, 1)[0],
            "row": lambda: torch_row(ch64, L - 1)[0],
            "mean": lambda: torch_materialize_mean(with_cb(t64), args.budget),
            "all": lambda: torch.stack([holistic(with_cb(one_channel(t64, k)), 0, 1)[0] for k in (0, c, D - 1)]),
        }
        for key in what:
            with torch.inference_mode():
                ref = refs[key]()
                err_i = rel_err(got[key].reshape(ref.shape), ref)
                ok &= err_i <= args.tolerance
                for label, f in cases[key]:
                    out, t_torch = cuda_best(lambda: f(t32), args.reps if key not in ("mean", "all") else 2)
                    if key == "all":
                        out = out[all_idx]
                    err_t = rel_err(out.reshape(ref.shape), ref)
                    del out
                    rows.append(dict(L=L, output=key, torch=label, iattn_s=it[key], resident_s=it[key + "_resident"],
                                     torch_s=t_torch, iattn_err=err_i, torch_err=err_t))
                    print(f"  L={L} {key} ({label}): iattn {it[key] * 1e3:.3f} ms (coefficients resident "
                          f"{it[key + '_resident'] * 1e3:.3f} ms), "
                          f"torch {t_torch * 1e3:.3f} ms; error vs float64: iattn {err_i:.1e}, torch {err_t:.1e}",
                          flush=True)
                del ref
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    print()
    print(f"{name}, torch {torch.__version__}, copy {copy_bw / 1e12:.2f} TB/s")
    print("| L | output | iattn, whole call | iattn, coefficients resident | PyTorch | PyTorch form | "
          "PyTorch / iattn resident | error iattn | error PyTorch |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['L']} | {r['output']} | {r['iattn_s'] * 1e3:.3f} ms | {r['resident_s'] * 1e3:.3f} ms | "
              f"{r['torch_s'] * 1e3:.3f} ms | {r['torch']} | **{r['torch_s'] / r['resident_s']:.1f}×** | "
              f"{r['iattn_err']:.1e} | {r['torch_err']:.1e} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=name, torch=torch.__version__, copy_bytes_per_s=copy_bw, rows=rows), fh, indent=1)
    if not ok:
        print(f"\nDISAGREEMENT: an iattn output differs from the float64 reference by more than {args.tolerance}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
