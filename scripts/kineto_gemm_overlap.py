#!/usr/bin/env python3
"""How much slower a plan's GEMMs run beside NCCL kernels than the same GEMMs of a reference plan run alone.

  kineto_gemm_overlap.py PLAN.kineto.json REFERENCE.kineto.json

Both are Kineto traces of one replay step (scripts/gpu_replay_kineto.sh) of plans with the same layers and
micro-batches (e.g. gpt-dp2-zero2-overlap-m2 against gpt-dp2-zero1-m2): their GEMM kernels (cuBLASLt's nvjet,
gemm, cutlass) are matched one to one in launch order (the count and names must agree). Each of PLAN's GEMMs
is classed by the NCCL kernels it runs beside (none; wholly or partly beside reduce-scatters, all-gathers,
all-reduces), and each class's total is printed against the matched reference GEMMs' total: the ratio is the
compute slowdown beside that kind of collective (sim/dp_overlap.md, "SM sharing").
"""
import collections
import json
import sys


def kernels(path):
    ev = json.load(open(path))["traceEvents"]
    return sorted([e for e in ev if e.get("ph") == "X" and e.get("cat") == "kernel"], key=lambda e: e["ts"])


def is_nccl(name):
    return "nccl" in name.lower()


def is_gemm(name):
    return not is_nccl(name) and (name.startswith("nvjet") or "gemm" in name.lower() or "cutlass" in name.lower())


def kind(name):
    return "reduce-scatter" if "ReduceScatter" in name else "all-gather" if "AllGather" in name else "all-reduce"


def overlap(a, b, intervals):
    return sum(max(0, min(b, y) - max(a, x)) for x, y in intervals if x < b and y > a)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    plan, ref = kernels(sys.argv[1]), kernels(sys.argv[2])
    gp, gr = [e for e in plan if is_gemm(e["name"])], [e for e in ref if is_gemm(e["name"])]
    if len(gp) != len(gr) or any(x["name"] != y["name"] for x, y in zip(gp, gr)):
        sys.exit(f"the GEMMs do not match one to one ({len(gp)} against {len(gr)}): not the same layers?")
    nccl = [e for e in plan if is_nccl(e["name"])]
    by_kind = collections.defaultdict(list)
    for e in nccl:
        by_kind[kind(e["name"])].append((e["ts"], e["ts"] + e["dur"]))
    every = [iv for ivs in by_kind.values() for iv in ivs]
    rows = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for x, y in zip(gp, gr):
        a, b = x["ts"], x["ts"] + x["dur"]
        frac = overlap(a, b, every) / x["dur"] if x["dur"] else 0.0
        beside = "+".join(k for k, ivs in sorted(by_kind.items()) if overlap(a, b, ivs) > 0)
        cls = "alone" if frac < 0.01 else f"{'wholly' if frac > 0.99 else 'partly'} beside {beside}"
        r = rows[cls]
        r[0] += 1
        r[1] += x["dur"] / 1e3
        r[2] += y["dur"] / 1e3
    print("| GEMMs | n | plan ms | reference ms | ratio |\n|---|---|---|---|---|")
    for cls, (n, p, q) in sorted(rows.items()):
        print(f"| {cls} | {n} | {p:.2f} | {q:.2f} | {p / q:.3f} |")
    for k, ivs in sorted(by_kind.items()):
        print(f"{k}: {len(ivs)} kernels, {sum(b - a for a, b in ivs) / 1e3:.2f} ms")


if __name__ == "__main__":
    main()
