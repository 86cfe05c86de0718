#!/usr/bin/env python3
"""Device memory in use, predicted against measured, per rank (issue 33 item 3).

  scripts/device_memory_table.py RUN_DIR [--out FILE] [--max-mape PCT]

RUN_DIR is a folder of scripts/validate_plans.py: for each plan NAME it reads
NAME.sim.json (`hetplan simulate --json`: per rank allocated_peak,
allocator_reserve, framework, nccl and their sum, total; sim/device_memory.h)
and NAME.replay.json (`hetplan replay`: per rank peak_allocated_mb,
peak_reserved_mb and device_used_mb, cudaMemGetInfo's total - free).

It prints a Markdown table, one row per rank, term by term:
  allocated:  predicted allocated_peak        against measured peak_allocated_mb
  reserve:    predicted allocator_reserve     against measured peak_reserved_mb - peak_allocated_mb
  outside:    predicted framework + nccl      against measured device_used_mb - peak_reserved_mb
  in use:     predicted total                 against measured device_used_mb
and the MAPE of "in use" over every measured rank (error = (measured - predicted) / measured).
Exit 1 when that MAPE is above --max-mape (default 5), 2 when nothing was measured.
"""
import argparse
import glob
import json
import os
import sys

MiB = 1024.0 * 1024.0


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--out", help="also write the table here")
    ap.add_argument("--max-mape", type=float, default=5.0)
    a = ap.parse_args()
    order_path = os.path.join(a.run_dir, "order.json")
    names = load(order_path) if os.path.exists(order_path) else None
    if not names:
        names = sorted(os.path.basename(f)[: -len(".sim.json")] for f in glob.glob(os.path.join(a.run_dir, "*.sim.json")))
    run = load(os.path.join(a.run_dir, "run.json")) or {}
    lines = [f"## Device memory in use: predicted (`hetplan simulate`) against measured (`hetplan replay`)\n",
             f"Run: {os.path.normpath(a.run_dir)}; machine: {run.get('machine', 'unknown')}.\n",
             "| plan | rank | stage (dp,tp) | allocated MiB pred / meas | reserve MiB pred / meas | "
             "framework+NCCL MiB pred / meas | in use MiB pred / meas | error |",
             "|---|---|---|---|---|---|---|---|"]
    apes, terms = [], {"allocated": [], "reserve": [], "outside": []}
    missing = []
    for name in names:
        sim = load(os.path.join(a.run_dir, f"{name}.sim.json"))
        rep = load(os.path.join(a.run_dir, f"{name}.replay.json"))
        plan = load(os.path.join(a.run_dir, f"{name}.plan.json")) or {}
        if sim is None:
            missing.append(f"{name}: no prediction")
            continue
        if rep is None:
            missing.append(f"{name}: not measured (no replay report)")
            continue
        strategies = plan.get("strategies", [])
        pred = {r["rank"]: r for r in sim["ranks"]}
        for m in sorted(rep["ranks"], key=lambda x: x["rank"]):
            p = pred.get(m["rank"])
            used = m.get("device_used_mb")
            if p is None or not used:
                missing.append(f"{name} rank {m['rank']}: {m.get('memory_note') or 'no device_used_mb'}")
                continue
            alloc, res = m["peak_allocated_mb"], m.get("peak_reserved_mb") or m["peak_allocated_mb"]
            pa, pr, po, pt = (p["allocated_peak"] / MiB, p.get("allocator_reserve", 0) / MiB,
                              (p["framework"] + p.get("nccl", 0)) / MiB, p["total"] / MiB)
            e = (used - pt) / used
            apes.append(abs(e))
            for key, mp, mm in (("allocated", pa, alloc), ("reserve", pr, res - alloc), ("outside", po, used - res)):
                terms[key].append(mm - mp)
            st = m.get("stage", p.get("stage", 0))
            dp_tp = f"({strategies[st][0]},{strategies[st][1]})" if st < len(strategies) else ""
            lines.append(f"| {name} | {m['rank']} | {st} {dp_tp} | {pa:.0f} / {alloc:.0f} | {pr:.0f} / {res - alloc:.0f} | "
                         f"{po:.0f} / {used - res:.0f} | {pt:.0f} / {used:.0f} | {100 * e:+.1f}% |")
    lines.append("")
    if not apes:
        lines.append("No rank was measured.")
    else:
        mape = 100 * sum(apes) / len(apes)
        plans = len({l.split(" | ")[0] for l in lines if l.startswith("| ") and not l.startswith("| plan")})
        lines.append(f"Device memory in use MAPE over {len(apes)} ranks of {plans} plans: {mape:.2f}% "
                     f"(worst {100 * max(apes):.1f}%); target <= {a.max_mape:g}%: "
                     f"{'met' if mape <= a.max_mape else 'NOT met'}.")
        for key, label in (("allocated", "allocated peak"), ("reserve", "allocator reserve"),
                           ("outside", "framework + NCCL")):
            v = terms[key]
            lines.append(f"- {label}: measured - predicted, mean {sum(v) / len(v):+.0f} MiB, "
                         f"range {min(v):+.0f} to {max(v):+.0f} MiB.")
    for x in missing:
        lines.append(f"- {x}")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    if not apes:
        sys.exit(2)
    sys.exit(0 if 100 * sum(apes) / len(apes) <= a.max_mape else 1)


if __name__ == "__main__":
    main()
