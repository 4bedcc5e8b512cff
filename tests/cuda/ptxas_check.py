#!/usr/bin/env python3
"""The CUDA kernels' resource check (docs/cuda.md, "The ptxas rule").

Compiles tests/cuda/kernels.cu (every kernel, float and double) with nvcc for each architecture
(-Xptxas -v) and checks ptxas' report of every kernel on every architecture:

  1. no local memory: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads;
  2. the register floor: registers <= 65536 / (threads * min_blocks), from the kernel's row in
     FLOORS below (the same numbers as its __launch_bounds__ in the source): at least
     threads * min_blocks resident threads per SM (sm_80, sm_90: 64 Ki registers, 2048 threads);
  3. shared memory for those blocks: min_blocks * (smem + 1 KiB reserved) within the SM's
     (164 KiB on sm_80, 228 KiB on sm_90);
  4. the report and FLOORS name the same kernels (a new kernel needs a row; a row needs a kernel).

  ptxas_check.py --nvcc NVCC --source kernels.cu --include DIR [--arch 80 --arch 90]
  ptxas_check.py --report FILE          checks a saved report (nvcc's output)
  ptxas_check.py --self-test            the checks fail where they should, on canned reports
Exit status 0 when every rule holds, 1 otherwise. Python standard library only.
"""
import argparse
import re
import subprocess
import sys

# kernel (its identifier) -> (threads per block, minimum resident blocks per SM)
FLOORS = {
    "diagonal_apply": (256, 4),        # elementwise: 1024 threads/SM, <= 64 registers
    "causal_conv_apply": (256, 4),
    "chunk_carry": (256, 4),
    "lr_chunk_states": (128, 8),       # one channel per thread: 1024 threads/SM, <= 64 registers
    "lr_chunk_outputs": (128, 8),
    "ss_chunk_states": (128, 4),       # up to 4 states per thread in registers (double):
    "ss_chunk_outputs": (128, 4),      #   512 threads/SM, <= 128 registers
    # one channel per thread, 16 states and a batch of tokens' loads in registers: float 384
    # threads/SM (<= 168 registers), double 256 (<= 255)
    "ss_channel_states": {"float": (128, 3), "double": (128, 2)},
    "ss_channel_outputs": {"float": (128, 3), "double": (128, 2)},
    "ss_tile_totals": (256, 4),
    "ss_tile_factors": (256, 4),       # C~ and B~ per (token, state)
    "ss_tile_mid": (256, 4),           # mid per (tile pair, state)
    "ss_materialize_macro": (256, 3),  # 16 accumulators, 13 KiB shared (float; 26 KiB double)
    "ss_materialize_tiles": (256, 4),  # 4 accumulators, 25 KiB shared (double): 1024 threads/SM
    "mean_accumulate": (256, 4),       # the channel means: a channel's matrix into the running mean
    "ssd_chunk_states": (256, 2),      # per-head decays: chunked matrix products, one block per
    "ssd_chunk_outputs": (256, 2),     #   (chunk, head); the chunk's Gram matrix in shared (33 KiB double)
    "head_mean_term": (256, 4),        # the structured means: a head's core times its channels' factors
    "mb_factors": (256, 4),            # the blocked means over (channel, state) pairs: factors,
    "mb_mid": (256, 4),                #   tile-pair mids,
    "mb_tiles": (256, 4),              #   32 x 32 tiles (25 KiB shared in double),
    "mb_band": (256, 4),               #   and the diagonals nearest the main one
    "widen_values": (256, 4),          # 16-bit storage: float16 / bfloat16 to float
    "narrow_values": (256, 4),         #   and float rounded to them
    "band_materialize": (256, 4),      # materialize, row and col of bands; band products
    "band_multiply": (256, 4),
    "band_vector": (256, 4),
    "lr_tile_totals": (256, 4),
    "lr_materialize_tiles": (256, 4),
    "lower_product_tiles": (256, 4),   # 4 accumulators, 17 KiB shared (double)
    "scan_vector_states": (256, 4),    # one channel's scan for row / col: one thread per (chunk, state)
    "scan_vector_outputs": (256, 4),
    "vector_sum_states": (256, 4),
    "reverse_rows": (256, 4),          # Flip: the token reversal
    "fill_value": (256, 4),            # RowNormalize: ones, and the division by the row sums
    "divide_rows": (256, 4),
    "group_norm_stats": (256, 4),      # GroupNorm: statistics per (token, group), in double
    "group_norm_scale": (256, 4),      # its diagonal, applied or written out
    "wkv_scan": (256, 4),              # RWKV's WKV: one channel per thread, log domain
    "wkv_carry": (256, 4),             # the chunked apply's states in chunk order, one channel per thread
    "wkv_transposed": (256, 4),
    "wkv_materialize": (256, 4),
    "softmax_apply": (256, 4),         # the softmax transformer: online softmax per (token, channel)
    "softmax_stats": (256, 4),
    "softmax_entries": (256, 4),
    "softmax_transposed": (256, 4),
    "cs_chunk_states": (128, 4),       # ComplexSemiseparable: up to 4 complex states per thread
    "cs_chunk_outputs": (128, 4),      #   (the lane layout of ss_chunk_*), 16 KiB shared (double)
    "cs_chunk_carry": (256, 4),
    "copy_strided": (256, 4),          # block: a row or column into the tile
    "transition_scan": (128, 4),       # the delta-rule recurrence: up to 8 states and increments per lane
    "transition_carry": (128, 2),      # the chunked apply's S_{j+1} = Phi_j S_j + E_j, one head's columns
}
REGISTERS_PER_SM = 65536
SHARED_PER_SM = {"sm_80": 164 * 1024, "sm_90": 228 * 1024}

ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+)'")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")


def kernel_of(mangled):
    """The FLOORS key whose length-prefixed identifier (Itanium mangling) is in the name."""
    hits = [k for k in FLOORS if f"{len(k)}{k}" in mangled]
    return max(hits, key=len) if hits else None


def floor_of(k, mangled):
    """(threads, min blocks) of kernel k; a FLOORS row may give one per element type instead,
    {"float": (..), "double": (..)}, read from the first template argument (f or d)."""
    row = FLOORS[k]
    if isinstance(row, dict):
        i = mangled.find(f"{len(k)}{k}I")
        code = mangled[i + len(f"{len(k)}{k}I")] if i >= 0 else "?"
        return row["double" if code == "d" else "float"]
    return row


def parse(text):
    """[(mangled, arch, registers, stack, spill stores, spill loads, smem)] from ptxas -v output."""
    out, cur = [], None
    for line in text.splitlines():
        m = ENTRY.search(line)
        if m:
            cur = {"name": m.group(1), "arch": m.group(2), "regs": None, "frame": None, "smem": 0}
            out.append(cur)
            continue
        if cur is None:
            continue
        m = FRAME.search(line)
        if m and cur["frame"] is None:
            cur["frame"] = tuple(int(g) for g in m.groups())
            continue
        m = USED.search(line)
        if m and cur["regs"] is None:
            cur["regs"] = int(m.group(1))
            cur["smem"] = int(m.group(3) or 0)
    return out


def demangle(names):
    try:
        r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
        return dict(zip(names, r.stdout.splitlines()))
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}


def check(entries, archs=None, quiet=False):
    """The violations (strings) of the rules in the module docstring."""
    bad = []
    if not entries:
        return ["no kernel in the report (did nvcc run with -Xptxas -v?)"]
    seen = {}
    pretty = demangle(sorted({e["name"] for e in entries})) if not quiet else {}
    rows = []
    for e in entries:
        k = kernel_of(e["name"])
        name = pretty.get(e["name"], e["name"])
        name = re.sub(r"^void |\(.*$", "", name).replace("iattn::cuda_detail::", "")
        label = f"{name} [{e['arch']}]"
        if k is None:
            bad.append(f"{label}: not in the FLOORS table of ptxas_check.py (add its threads and min blocks)")
            continue
        seen.setdefault(k, set()).add(e["arch"])
        if e["regs"] is None or e["frame"] is None:
            bad.append(f"{label}: no register or stack-frame line in the report")
            continue
        threads, blocks = floor_of(k, e["name"])
        cap = REGISTERS_PER_SM // (threads * blocks)
        frame, stores, loads = e["frame"]
        rows.append((k, e["arch"], e["regs"], cap, frame, stores, loads, e["smem"], label))
        if stores or loads:
            bad.append(f"{label}: spills ({stores} bytes stored, {loads} bytes loaded to local memory)")
        if frame:
            bad.append(f"{label}: {frame} bytes of stack frame (local memory)")
        if e["regs"] > cap:
            bad.append(f"{label}: {e['regs']} registers > {cap}, the floor of {threads * blocks} resident "
                       f"threads per SM ({threads} threads x {blocks} blocks)")
        smem_cap = SHARED_PER_SM.get(e["arch"], SHARED_PER_SM["sm_80"])
        if blocks * (e["smem"] + 1024) > smem_cap:
            bad.append(f"{label}: {e['smem']} bytes of shared memory: {blocks} blocks need more than the "
                       f"SM's {smem_cap // 1024} KiB")
    for k in FLOORS:
        missing = (set(archs) if archs else set()) - seen.get(k, set())
        if k not in seen:
            bad.append(f"{k}: in FLOORS but not in the report (instantiate it in tests/cuda/kernels.cu)")
        elif missing:
            bad.append(f"{k}: not compiled for {', '.join(sorted(missing))}")
    if not quiet:
        print(f"{'kernel':32} {'arch':6} {'regs':>4} {'cap':>4} {'stack':>5} {'spill':>7} {'smem':>6}")
        for k, arch, regs, cap, frame, stores, loads, smem, label in sorted(rows, key=lambda r: r[8]):
            print(f"{label.split(' [')[0]:32} {arch:6} {regs:4d} {cap:4d} {frame:5d} {stores:3d}/{loads:<3d} {smem:6d}")
    return bad


def run_nvcc(args):
    """ptxas' report for every architecture: one device-only compile (-cubin: no host pass) per
    architecture, all started at once (the test command's stage 1 waits for this one)."""
    procs = []
    for a in args.arch:
        out = f"{args.output}.sm_{a}.cubin"
        cmd = [args.nvcc, "-std=c++20", "-cubin", args.source, "-o", out, "-Xptxas", "-v", "-I", args.include,
               f"-arch=sm_{a}"]
        print(" ".join(cmd))
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    text, failed = "", False
    for p in procs:
        out, _ = p.communicate()
        text += out
        failed |= p.returncode != 0
    if failed:
        sys.stdout.write(text)
        print("nvcc failed")
        sys.exit(1)
    return text


CANNED = """ptxas info    : Compiling entry function '_ZN5iattn11cuda_detail14diagonal_applyIfEEvNS0_13diagonal_argsIT_EE' for 'sm_80'
ptxas info    : Function properties for _ZN5iattn11cuda_detail14diagonal_applyIfEEvNS0_13diagonal_argsIT_EE
    {frame} bytes stack frame, {stores} bytes spill stores, {loads} bytes spill loads
ptxas info    : Used {regs} registers, used 0 barriers, 380 bytes cmem[0]
"""


def self_test():
    global FLOORS
    saved = FLOORS
    FLOORS = {"diagonal_apply": (256, 4)}
    try:
        ok = parse(CANNED.format(frame=0, stores=0, loads=0, regs=40))
        assert ok[0]["regs"] == 40 and ok[0]["frame"] == (0, 0, 0) and ok[0]["arch"] == "sm_80", ok
        assert check(ok, ["sm_80"], quiet=True) == []
        assert any("spills" in b for b in check(parse(CANNED.format(frame=16, stores=16, loads=8, regs=40)), quiet=True))
        assert any("stack frame" in b for b in check(parse(CANNED.format(frame=8, stores=0, loads=0, regs=40)), quiet=True))
        assert any("registers > 64" in b for b in check(parse(CANNED.format(frame=0, stores=0, loads=0, regs=72)), quiet=True))
        big = CANNED.replace("380 bytes cmem[0]", "50000 bytes smem, 380 bytes cmem[0]")
        assert any("shared memory" in b for b in check(parse(big.format(frame=0, stores=0, loads=0, regs=40)), quiet=True))
        assert any("not compiled for sm_90" in b for b in check(ok, ["sm_80", "sm_90"], quiet=True))
        other = CANNED.replace("14diagonal_apply", "11mystery_op").format(frame=0, stores=0, loads=0, regs=10)
        problems = check(parse(other), quiet=True)
        assert any("not in the FLOORS table" in b for b in problems), problems
        assert any("not in the report" in b for b in problems), problems
        assert check([], quiet=True) != []
        FLOORS = {"chunk_carry": (256, 4), "lr_chunk_states": (128, 8), "ss_chunk_states": (128, 4)}
        assert kernel_of("_ZN5iattn11cuda_detail15ss_chunk_statesIfLi1EEEv") == "ss_chunk_states"
        assert kernel_of("_ZN5iattn11cuda_detail15lr_chunk_statesIfEEv") == "lr_chunk_states"
        assert kernel_of("_ZN5iattn11cuda_detail11chunk_carryIfEEv") == "chunk_carry"
        FLOORS = {"ss_channel_states": {"float": (128, 3), "double": (128, 2)}}
        assert floor_of("ss_channel_states", "_ZN5iattn11cuda_detail17ss_channel_statesIdLi16EEEv") == (128, 2)
        assert floor_of("ss_channel_states", "_ZN5iattn11cuda_detail17ss_channel_statesIfLi16EEEv") == (128, 3)
    finally:
        FLOORS = saved
    print("ptxas_check self-test: ok")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nvcc")
    p.add_argument("--source")
    p.add_argument("--include")
    p.add_argument("--output", default="iattn_kernels.o")
    p.add_argument("--arch", action="append")
    p.add_argument("--report")
    p.add_argument("--self-test", action="store_true")
    args = p.parse_args()
    if args.self_test:
        self_test()
        return 0
    args.arch = args.arch or ["80", "90"]
    if args.report:
        with open(args.report) as f:
            text = f.read()
    else:
        if not (args.nvcc and args.source and args.include):
            p.error("--nvcc, --source and --include are required (or --report, or --self-test)")
        text = run_nvcc(args)
    bad = check(parse(text), [f"sm_{a}" for a in args.arch])
    for b in bad:
        print("FAIL:", b)
    print("ptxas check:", "ok" if not bad else f"{len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
