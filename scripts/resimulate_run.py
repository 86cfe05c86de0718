#!/usr/bin/env python3
"""Re-simulates a validation run folder with this checkout's build and compares with its replay results.

    python3 scripts/resimulate_run.py RUN_DIR [--hetplan build-nt/hetplan] [--hostfile FILE] [--write DIR]

RUN_DIR is a validate_plans.py run folder (logs/validate/...): its NAME.plan.json, NAME.replay.json, log.txt
(the `hetplan simulate` command each plan was simulated with) and profiles/ (the profiles it used). Each plan is
simulated again from those profiles with the same flags and --held-sends (replay's sends keep their tensors until a
stage's last op; --no-held-sends leaves it out) (the plan's profile_dir pointed at RUN_DIR/profiles; its hostfile
at --hostfile where the recorded one is not here), and the iteration time and each rank's allocated peak
are printed against replay's, with the run's MAPE, and each rank's device memory in use (sim/device_memory.h's
total) against replay's device_used_mb, with its MAPE. Nothing in RUN_DIR is written; scratch goes to a temp
folder. --write DIR copies the new NAME.sim.json with the run's NAME.replay.json, NAME.plan.json, order.json and
run.json into DIR, for scripts/device_memory_table.py DIR (the term-by-term table).

--phases adds, under each plan, one line per pipeline stage (its first rank in replay's trace
NAME.replay.trace.json): the simulated forward and backward (with the gradient accumulation the simulator charges
to every micro-batch but the first) against replay's median per micro-batch (an interleaved stage's chunks summed
per micro-batch), the spread of replay's spans over the micro-batches after the first ((max - min) / median: identical work that
varies by more than a few percent is paced by the host, not the GPU), and replay's first backward over its later
ones (the simulator's first micro-batch skips the accumulation; a replay whose backwards are all alike does not).
"""
import argparse, glob, json, os, shutil, subprocess, sys, tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("run_dir")
ap.add_argument("--hetplan", default=os.path.join(root, "build-nt", "hetplan"))
ap.add_argument("--hostfile", help="hostfile for plans whose recorded one is not in this checkout")
ap.add_argument("--no-held-sends", action="store_true", help="simulate without --held-sends")
ap.add_argument("--phases", action="store_true",
                help="per stage: simulated forward/backward against replay's spans, their spread, first backward")
ap.add_argument("--write", help="copy the new .sim.json files (and the run's replay, plan, order and run files) here")
a = ap.parse_args()
run = os.path.abspath(a.run_dir)
commands = {}
for line in open(os.path.join(run, "log.txt")):
    words = line.strip().lstrip("+ ").split()
    if "simulate" in words and "--plan" in words and "metis" not in words:
        commands[os.path.basename(words[words.index("--plan") + 1])[: -len(".plan.json")]] = words[words.index("simulate") + 1 :]
scratch = tempfile.mkdtemp(prefix="resimulate-")
mem_err, time_err, used_err = [], [], []


def phase_lines(sim, trace_file):
    """One line per stage: simulated forward / backward(+accumulation) against replay's per-micro-batch spans."""
    if not os.path.exists(trace_file):
        return ["  (no replay trace)"]
    events = json.load(open(trace_file))["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    lines = []
    for i, st in enumerate(sim["stages"]):
        pids = sorted(pid for pid, n in names.items() if f"stage {i}," in n or f"stage {i})" in n)
        if not pids:
            continue
        per_mb = {"forward": {}, "backward": {}}
        for e in events:
            if e.get("ph") == "X" and e.get("pid") == pids[0] and e.get("name") in per_mb:
                mb = e.get("args", {}).get("micro_batch", -1)
                per_mb[e["name"]][mb] = per_mb[e["name"]].get(mb, 0.0) + e["dur"] / 1e3
        fw = [per_mb["forward"][k] for k in sorted(per_mb["forward"])]
        bw = [per_mb["backward"][k] for k in sorted(per_mb["backward"])]
        if not fw or not bw:
            continue
        med = lambda v: sorted(v)[len(v) // 2] if len(v) % 2 else sum(sorted(v)[len(v) // 2 - 1 : len(v) // 2 + 1]) / 2
        # Over the micro-batches after the first (which starts into an empty queue, or behind a pipeline's fill).
        spread = lambda v: (max(v[1:]) - min(v[1:])) / med(v[1:]) * 100 if len(v) > 2 else 0.0
        acc = st.get("accumulation_ms", 0.0)
        first = f"; first backward / later {bw[0] / med(bw[1:]):.3f} (sim {st['backward_ms'] / (st['backward_ms'] + acc):.3f})" \
            if len(bw) > 1 else ""
        lines.append(f"  stage {i} (rank {pids[0]}): forward {st['forward_ms']:.2f} vs {med(fw):.2f} ms "
                     f"(spread {spread(fw):.0f}%), backward+acc {st['backward_ms'] + acc:.2f} vs {med(bw):.2f} ms "
                     f"(spread {spread(bw):.0f}%){first}")
    return lines
if a.write:
    os.makedirs(a.write, exist_ok=True)
    for f in ("order.json", "run.json"):
        if os.path.exists(os.path.join(run, f)):
            shutil.copy(os.path.join(run, f), a.write)
for plan_file in sorted(glob.glob(os.path.join(run, "*.plan.json"))):
    name = os.path.basename(plan_file)[: -len(".plan.json")]
    replay_file = os.path.join(run, name + ".replay.json")
    if name not in commands or not os.path.exists(replay_file):
        continue
    plan = json.load(open(plan_file))
    plan["profile_dir"] = os.path.join(run, "profiles", os.path.basename(plan["profile_dir"].rstrip("/")))
    for key in ("hostfile", "clusterfile"):
        path = os.path.join(root, plan[key])
        plan[key] = path if os.path.exists(path) or key == "clusterfile" or not a.hostfile else os.path.abspath(a.hostfile)
    local = os.path.join(scratch, name + ".plan.json")
    json.dump(plan, open(local, "w"))
    args = list(commands[name])
    args[args.index("--plan") + 1] = local
    sim_file = os.path.join(scratch, name + ".sim.json")
    args[args.index("--json") + 1] = sim_file
    args = [os.path.join(root, x) if x.startswith("scripts/") else x for x in args]
    if not a.no_held_sends and "--held-sends" not in args:
        args.append("--held-sends")
    r = subprocess.run([a.hetplan, "simulate"] + args, capture_output=True, text=True, cwd=root)
    if r.returncode != 0:
        print(f"{name}: simulate failed: {r.stderr.strip()[-300:]}")
        continue
    sim, rep = json.load(open(sim_file)), json.load(open(replay_file))
    pred = [x["allocated_peak"] / 2**20 for x in sim["ranks"]]
    meas = [x["peak_allocated_mb"] for x in rep["ranks"]]
    errs = [(m - p) / m * 100 for p, m in zip(pred, meas)]
    mem_err += errs
    used = {x["rank"]: x.get("device_used_mb") for x in rep["ranks"]}
    used_plan = []
    for x in sim["ranks"]:
        u = used.get(x["rank"])
        if u and "total" in x:
            used_plan.append((u - x["total"] / 2**20) / u * 100)
    used_err += used_plan
    if a.write:
        shutil.copy(sim_file, a.write)
        for f in (replay_file, plan_file):
            shutil.copy(f, a.write)
    t_meas = rep["iteration_ms"]["median"]
    time_err.append((t_meas - sim["iteration_ms"]) / t_meas * 100)
    print(f"{name}: time {sim['iteration_ms']:.1f} vs {t_meas:.1f} ms ({time_err[-1]:+.1f}%); peak MB "
          f"{'/'.join('%.0f' % x for x in pred)} vs {'/'.join('%.0f' % x for x in meas)} "
          f"({'/'.join('%+.1f%%' % x for x in errs)})"
          + (f"; in use {'/'.join('%+.1f%%' % x for x in used_plan)}" if used_plan else ""))
    if a.phases:
        print("\n".join(phase_lines(sim, os.path.join(run, name + ".replay.trace.json"))))
if not mem_err:
    sys.exit("no plan with a replay result and a recorded simulate command in " + run)
print(f"iteration-time MAPE over {len(time_err)} plans: {sum(map(abs, time_err)) / len(time_err):.2f}% "
      f"(worst {max(map(abs, time_err)):.1f}%)")
print(f"per-rank peak-memory MAPE over {len(mem_err)} ranks: {sum(map(abs, mem_err)) / len(mem_err):.2f}% "
      f"(worst {max(map(abs, mem_err)):.1f}%)")
if used_err:
    print(f"device-memory-in-use MAPE over {len(used_err)} ranks: {sum(map(abs, used_err)) / len(used_err):.2f}% "
          f"(worst {max(map(abs, used_err)):.1f}%)")
