#!/usr/bin/env python3
"""Per rank and model chunk, replay's op times against the simulator's, from their Chrome traces.

    python3 scripts/compare_traces.py RUN_DIR NAME [--hetplan build-nt/hetplan] [--hostfile FILE] [--order]

RUN_DIR is a validate_plans.py run folder (logs/validate/...) holding NAME.plan.json, NAME.replay.json,
NAME.replay.trace.json (replay's spans per rank), log.txt (the `hetplan simulate` command NAME was simulated
with) and profiles/ (the run's profiles; else the plan's profile_dir in this checkout). NAME is simulated again
with this build (--held-sends added, as resimulate_run.py does) and a --trace, and each (rank, chunk, op) --
forward, backward, allreduce, optimizer -- prints replay's median span, the simulator's and their difference
(positive: replay slower). --order also says whether each rank runs its forwards and backwards in the same
order in both, and each rank's busy and idle time. Nothing in RUN_DIR is written.
"""
import argparse, collections, json, os, statistics, subprocess, sys, tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("run_dir")
ap.add_argument("name")
ap.add_argument("--hetplan", default=os.path.join(root, "build-nt", "hetplan"))
ap.add_argument("--hostfile", help="hostfile where the plan's recorded one is not in this checkout")
ap.add_argument("--order", action="store_true", help="compare the op order and busy time per rank too")
a = ap.parse_args()
run = os.path.abspath(a.run_dir)

args = None
for line in open(os.path.join(run, "log.txt")):
    words = line.strip().lstrip("+ ").split()
    if "simulate" in words and "--plan" in words and "metis" not in words:
        if os.path.basename(words[words.index("--plan") + 1]) == a.name + ".plan.json":
            args = words[words.index("simulate") + 1 :]
if args is None:
    sys.exit(f"{run}/log.txt: no `hetplan simulate` command for {a.name}")
plan = json.load(open(os.path.join(run, a.name + ".plan.json")))
own = os.path.join(run, "profiles", os.path.basename(plan["profile_dir"].rstrip("/")))
plan["profile_dir"] = own if os.path.isdir(own) else os.path.join(root, plan["profile_dir"])
for key in ("hostfile", "clusterfile"):
    path = os.path.join(root, plan[key])
    plan[key] = path if os.path.exists(path) or key == "clusterfile" or not a.hostfile else os.path.abspath(a.hostfile)
scratch = tempfile.mkdtemp(prefix="compare-traces-")
local = os.path.join(scratch, a.name + ".plan.json")
json.dump(plan, open(local, "w"))
args[args.index("--plan") + 1] = local
sim_file, trace_file = os.path.join(scratch, "sim.json"), os.path.join(scratch, "trace.json")
args[args.index("--json") + 1] = sim_file
args = [os.path.join(root, x) if x.startswith("scripts/") else x for x in args]
if "--held-sends" not in args:
    args.append("--held-sends")
r = subprocess.run([a.hetplan, "simulate"] + args + ["--trace", trace_file], capture_output=True, text=True, cwd=root)
if r.returncode != 0:
    sys.exit(f"simulate failed: {r.stderr.strip()[-300:]}")

OPS = ("forward", "backward", "allreduce", "optimizer")


def spans(path, mb_key):
    """(rank, chunk, op) -> durations in ms; rank -> [(op, micro-batch, chunk, start, duration)] in start order."""
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X" and e["name"] in OPS]
    by_op, by_rank = collections.defaultdict(list), collections.defaultdict(list)
    for e in sorted(events, key=lambda e: e["ts"]):
        args = e.get("args", {})
        chunk = args.get("chunk", 0)
        by_op[(e["pid"], chunk, e["name"])].append(e["dur"] / 1e3)
        by_rank[e["pid"]].append((e["name"], args.get(mb_key, -1), chunk, e["ts"] / 1e3, e["dur"] / 1e3))
    return by_op, by_rank


rep_ops, rep_ranks = spans(os.path.join(run, a.name + ".replay.trace.json"), "micro_batch")
sim_ops, sim_ranks = spans(trace_file, "microbatch")
sim, rep = json.load(open(sim_file)), json.load(open(os.path.join(run, a.name + ".replay.json")))
measured = rep["iteration_ms"]["median"]
print(f"{a.name}: simulated {sim['iteration_ms']:.1f} ms, replay {measured:.1f} ms "
      f"({(measured - sim['iteration_ms']) / measured * 100:+.1f}%)")
print("rank chunk op         replay ms (n)   simulated ms   replay - simulated")
for key in sorted(set(rep_ops) | set(sim_ops)):
    rv, sv = rep_ops.get(key, []), sim_ops.get(key, [])
    rm = statistics.median(rv) if rv else float("nan")
    sm = statistics.median(sv) if sv else float("nan")
    print(f"{key[0]:4d} {key[1]:5d} {key[2]:10s} {rm:9.2f} ({len(rv):2d})   {sm:12.2f}   {rm - sm:+18.2f}")
if a.order:
    for rank in sorted(set(rep_ranks) | set(sim_ranks)):
        compute = lambda ops: [(o, mb, c) for o, mb, c, _, _ in ops if o in ("forward", "backward")]
        same = compute(rep_ranks.get(rank, [])) == compute(sim_ranks.get(rank, []))
        line = [f"rank {rank}: same forward/backward order: {same}"]
        for label, ops in (("replay", rep_ranks.get(rank, [])), ("simulated", sim_ranks.get(rank, []))):
            fb = [x for x in ops if x[0] in ("forward", "backward")]
            if fb:
                busy = sum(x[4] for x in fb)
                span = fb[-1][3] + fb[-1][4] - fb[0][3]
                line.append(f"{label} busy {busy:.1f} ms of {span:.1f} (first op at {fb[0][3]:.2f})")
        print("; ".join(line))
