#!/usr/bin/env python3
"""Validates hetplan's predictions on real GPUs: for each plan of a suite,
`hetplan simulate` predicts the iteration time and each rank's peak memory,
`hetplan replay` measures them, and a Markdown table of predicted against
measured (errors, and the MAPE of time and of per-rank memory, reported
separately) is written next to the run and to logs/.

  scripts/validate_plans.py --suite SUITE.json [--bin PATH] [--iters N] [--warmup N]
                            [--only NAME,NAME] [--out DIR] [--report FILE] [--profile]
  scripts/validate_plans.py --table DIR [--resimulate] [--bin PATH] [--report FILE]

A suite (see scripts/validation/*.json) names a hostfile and clusterfile,
its models (a Hugging Face config.json each, and the profile folder measured
for it) and its plans: stages (device_groups, strategies as [dp, tp],
layer_partition over the model's Metis layers), micro-batch count, global
batch, zero_stage, recompute and schedule. Any model, hostfile (emulated
device types included: replay runs each rank as its type) and layer count.

--profile first runs `hetplan profile` for each model into its profile folder
(tp and micro-batch sizes from the suite's "profile" entry), so that the
predictions of a fresh run rest on fresh measurements of the same machine.
The measured numbers never feed back into the model: predictions are made
from the profiles alone, before the replays run.

Memory: predicted `allocated_peak` (model states, activations, working set;
what the caching allocator's peak counts) against replay's peak allocated per
rank; where replay reports the device memory in use (CUDA context and NCCL
included), that too against the predicted total.

Side by side, every plan is also scored by the Metis formula (`hetplan simulate
--cost-model metis`, the cost and memory demand `search --cost-model metis`
computes, written to NAME.metis.json with the other predictions): its
iteration time and per-rank memory against the same measurements. Run folders
from before this have no NAME.metis.json; --table DIR --resimulate adds them.
"""
import argparse
import glob
import json
import os
import platform
import re
import subprocess
import sys
import time

MiB = 1024.0 * 1024.0


def run(cmd, log=None, check=True):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if log:
        with open(log, "a") as f:
            f.write("+ " + " ".join(cmd) + "\n" + p.stdout + f"(exit {p.returncode}, {time.time() - t0:.1f} s)\n")
    if p.returncode != 0:
        tail = "\n".join(p.stdout.strip().splitlines()[-6:])
        msg = f"validate_plans: {' '.join(cmd[:2])} exited {p.returncode}:\n{tail}"
        if check:
            sys.exit(msg)
        print(msg, file=sys.stderr)
    return p


def load_suite(path):
    try:
        s = json.load(open(path))
    except (OSError, ValueError) as e:
        sys.exit(f"validate_plans: {path}: {e}")
    for key in ("hostfile", "clusterfile", "models", "plans"):
        if key not in s:
            sys.exit(f"validate_plans: {path}: missing key '{key}'")
    for name, m in s["models"].items():
        for key in ("hf_config", "profiles"):
            if key not in m:
                sys.exit(f"validate_plans: {path}: key 'models.{name}' has no '{key}'")
    names = set()
    for i, p in enumerate(s["plans"]):
        need = ("name", "model", "gbs") if "search" in p else \
            ("name", "model", "device_groups", "strategies", "layer_partition", "batches", "gbs")
        for key in need:
            if key not in p:
                sys.exit(f"validate_plans: {path}: key 'plans[{i}]' has no '{key}'")
        if p["model"] not in s["models"]:
            sys.exit(f"validate_plans: {path}: key 'plans[{i}].model': '{p['model']}' is not one of the suite's models")
        if p["name"] in names:
            sys.exit(f"validate_plans: {path}: plan name '{p['name']}' appears twice")
        names.add(p["name"])
    return s


def hf_layers(hf_path):
    c = json.load(open(hf_path))
    return int(c.get("n_layer", c.get("num_hidden_layers", 0))) + 2  # Metis layers: embedding + blocks + head


def plan_file(suite, p):
    m = suite["models"][p["model"]]
    c = json.load(open(m["hf_config"]))
    layers = hf_layers(m["hf_config"])
    seq = int(m.get("sequence_length", 2048))
    hosts = [l.split()[0] for l in open(suite["hostfile"]) if l.strip() and not l.startswith("#")]
    cf = json.load(open(suite["clusterfile"]))
    types = []
    for h in hosts:  # the hostfile's device types, in its order
        if cf[h]["instance_type"] not in types:
            types.append(cf[h]["instance_type"])
    return {
        "node_sequence": p.get("node_sequence", types),
        "device_groups": p["device_groups"],
        "strategies": p["strategies"],
        "batches": p["batches"],
        "layer_partition": p["layer_partition"],
        "model": {
            "model_name": c.get("model_type", "model"),
            "model_size": os.path.basename(m["hf_config"]),
            "num_layers": layers,
            "hidden_size": int(c.get("n_embd", c.get("hidden_size"))),
            "sequence_length": seq,
            "vocab_size": int(c["vocab_size"]),
            "attention_heads": int(c.get("n_head", c.get("num_attention_heads"))),
        },
        "gbs": p["gbs"],
        "hostfile": suite["hostfile"],
        "clusterfile": suite["clusterfile"],
        "profile_dir": m["profiles"],
        "schedule": p.get("schedule", "1f1b"),
        "zero_stage": p.get("zero_stage", 0),
        "recompute": p.get("recompute", "none"),
        # Interleaved 1F1B: model chunks per pipeline rank (absent: 1).
        **({"virtual_stages": p["virtual_stages"]} if p.get("virtual_stages", 1) > 1 else {}),
        # Sequence parallelism (with tp), context parallelism (carved from dp) and overlapped data-parallel
        # communication, where the suite's plan sets them (the plan-file keys, sim/plan_file.h).
        **{k: p[k] for k in PLAN_SETTINGS if k in p},
    }


PLAN_SETTINGS = ("sequence_parallel", "context_parallel", "overlap")


def settings_suffix(p):
    """The plan's SP / cp / overlap settings, for the table's schedule column."""
    out = ""
    if p.get("sequence_parallel"):
        out += " +SP"
    if p.get("context_parallel", 1) > 1:
        out += f" cp{p['context_parallel']}"
    o = p.get("overlap") or {}
    if o.get("grad_reduce"):
        out += " +overlap-grad"
    if o.get("param_gather"):
        out += " +overlap-param"
    return out


def searched_plan(suite, p, binary, work, log):
    """A plan entry {"search": {"cost_model": "sim" | "metis", "args": [...]}}: the best plan that
    `hetplan search` finds for the suite's cluster and the model's profiles."""
    m = suite["models"][p["model"]]
    base = plan_file(suite, dict(p, device_groups=[], strategies=[], layer_partition=[], batches=1))
    mc = base["model"]
    cm = p["search"].get("cost_model", "sim")
    out = f"{work}/{p['name']}.search.json"
    cmd = [binary, "search", "-q", "--cost-model", cm, "--hostfile", suite["hostfile"], "--clusterfile",
           suite["clusterfile"], "--profiles", m["profiles"], "--num_layers", str(mc["num_layers"]),
           "--hidden_size", str(mc["hidden_size"]), "--sequence_length", str(mc["sequence_length"]),
           "--vocab_size", str(mc["vocab_size"]), "--heads", str(mc["attention_heads"]), "--gbs", str(p["gbs"]),
           "--json", out]
    if cm == "sim":
        cmd += ["--hf-config", m["hf_config"]]
    else:
        cmd += ["--reject-dropped-layers"]
    run(cmd + p["search"].get("args", []), log)
    best = json.load(open(out))["best"]
    plan = dict(base)
    for key in ("node_sequence", "device_groups", "strategies", "batches", "layer_partition"):
        plan[key] = best[key]
    plan["cost"] = best.get("cost")
    for key in ("zero_stage", "recompute", "schedule", "virtual_stages") + PLAN_SETTINGS:
        if key in best:
            plan[key] = best[key]
    plan["chosen_by"] = f"hetplan search --cost-model {cm}"
    if cm == "metis" and p["search"].get("args"):
        plan["metis_search_args"] = p["search"]["args"]
    return plan


# The Metis search options that choose what `simulate --cost-model metis` reproduces.
METIS_FLAGS = ("--max_profiled_batch_size", "--max-profiled-batch-size", "--min_group_scale_variance",
               "--min-group-scale-variance", "--max_permute_len", "--max-permute-len")


def metis_args(plan):
    """The Metis search options of a plan that `search --cost-model metis` chose (its suite args)."""
    out, args = [], plan.get("metis_search_args", [])
    for i, a in enumerate(args):
        flag = a.split("=", 1)[0]
        if flag in METIS_FLAGS:
            out += [a] if "=" in a else args[i:i + 2]
    return out


def simulate_metis(binary, plan_path, work, name, log=None):
    """The Metis formula's estimate for a plan, to NAME.metis.json (a plan it cannot take is reported, not fatal)."""
    plan = json.load(open(plan_path))
    run([binary, "simulate", "--plan", plan_path, "--cost-model", "metis", "--json", f"{work}/{name}.metis.json"]
        + metis_args(plan), log, check=False)


def profile_models(suite, binary, log):
    """Profiles each model into its folder: once per entry of the suite's profile.device_types
    (each {"type": NAME, "args": [...]}, e.g. an emulated type with --clusterfile), or once for the
    GPU as it is."""
    prof = suite.get("profile", {})
    for name, m in suite["models"].items():
        os.makedirs(m["profiles"], exist_ok=True)
        for dt in prof.get("device_types", [{}]):
            cmd = [binary, "profile", "--hf-config", m["hf_config"], "--num-layers", str(hf_layers(m["hf_config"])),
                   "--seq-len", str(m.get("sequence_length", 2048)), "--tp", dt.get("tp", prof.get("tp", "1,2")),
                   "--bs", prof.get("bs", "1,2,4"), "--iters", str(prof.get("iters", 10)), "--out", m["profiles"]]
            if "type" in dt:
                cmd += ["--device-type", dt["type"]]
            cmd += dt.get("args", []) + prof.get("extra_args", [])
            run(cmd, log)


def fmt_list(v, f="{:.0f}"):
    return "/".join(f.format(x) for x in v)


def pct(v):
    return f"{100 * v:+.1f}%"


def mape_line(apes):
    return f"{100 * sum(apes) / len(apes):.2f}% (worst {100 * max(apes):.1f}%)"


def table(work, suite_name, machine):
    rows, t_ape, m_ape, u_ape = [], [], [], []
    mt_ape, mm_ape, ms_ape, metis_notes = [], [], [], []  # the Metis formula's
    any_metis = False
    plans = sorted(glob.glob(f"{work}/*.plan.json"))
    order = json.load(open(f"{work}/order.json")) if os.path.exists(f"{work}/order.json") else None
    if order:
        plans = [f"{work}/{n}.plan.json" for n in order if os.path.exists(f"{work}/{n}.plan.json")]
    out = []
    out.append(f"## {suite_name}: predicted vs measured ({os.path.basename(os.path.normpath(work))})\n")
    out.append(f"Machine: {machine}.\n")
    out.append("| plan | model | stages: GPUs (dp,tp) layers | m x gbs | ZeRO | recompute | schedule | simulated ms | "
               "measured ms (spread) | time error | predicted peak MB per rank | measured peak MB per rank | "
               "worst memory error | Metis ms | Metis time error | Metis peak MB per rank | "
               "Metis worst memory error |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for f in plans:
        name = os.path.basename(f)[: -len(".plan.json")]
        p = json.load(open(f))
        meta = json.load(open(f"{work}/{name}.meta.json")) if os.path.exists(f"{work}/{name}.meta.json") else {}
        sim_path = f"{work}/{name}.sim.json"
        if not os.path.exists(sim_path):
            continue
        sim = json.load(open(sim_path))
        lp = p["layer_partition"]
        stages = "; ".join(f"{g} ({d},{t}) [{lp[i]},{lp[i+1]})" for i, (g, (d, t)) in
                           enumerate(zip(p["device_groups"], p["strategies"])))
        pred_alloc = [r["allocated_peak"] / MiB for r in sorted(sim["ranks"], key=lambda r: r["rank"])]
        pred_total = [r["total"] / MiB for r in sorted(sim["ranks"], key=lambda r: r["rank"])]
        mp = f"{work}/{name}.metis.json"
        metis = json.load(open(mp)) if os.path.exists(mp) else None
        any_metis |= metis is not None
        label = p.get("chosen_by", "").split()[-1] + "'s best" if p.get("chosen_by") else ""
        shown = f"{name} ({label})" if label else name
        metis_ms_s, metis_err_s, metis_mem_s, metis_merr_s = ("not run", "", "", "") if metis is None else ("", "", "", "")
        if metis is not None:
            if metis.get("iteration_ms") is None:
                metis_ms_s = "skipped"
                metis_notes.append(f"{shown}: Metis cannot cost it: {metis.get('skipped', '')}")
            else:
                metis_ms_s = f"{metis['iteration_ms']:.1f}"
                sl = metis.get("search_label")
                if sl and sl.get("iteration_ms") is not None:
                    metis_ms_s += f" (search: {sl['iteration_ms']:.1f} as {sl['num_stage']} stage)"
            if metis.get("ranks"):
                metis_mem_s = fmt_list([x["memory_mb"] for x in sorted(metis["ranks"], key=lambda x: x["rank"])])
            elif "memory_skipped" in metis:
                metis_mem_s = "skipped"
                metis_notes.append(f"{shown}: Metis cannot size its memory: {metis['memory_skipped']}")
        rp = f"{work}/{name}.replay.json"
        meas_s, err_s, mm_s, merr_s = "not measured", "", "", ""
        if os.path.exists(rp):
            r = json.load(open(rp))
            meas = r["iteration_ms"]["median"]
            spread = r["iteration_ms"].get("spread", 0)
            e = (meas - sim["iteration_ms"]) / meas
            t_ape.append(abs(e))
            meas_s, err_s = f"{meas:.1f} ({100 * spread:.1f}%)", f"{100 * e:+.1f}%"
            ranks = sorted(r["ranks"], key=lambda x: x["rank"])
            measured = [x["peak_memory_mb"] for x in ranks]
            mm_s = fmt_list(measured)
            errs = []
            for x, pa in zip(ranks, pred_alloc):
                e = (x["peak_memory_mb"] - pa) / x["peak_memory_mb"] if x["peak_memory_mb"] > 0 else 0
                errs.append(e)
                m_ape.append(abs(e))
            for x, pt in zip(ranks, pred_total):
                used = x.get("device_used_mb")
                if used:
                    u_ape.append(abs((used - pt) / used))
            merr_s = f"{100 * max(errs, key=abs):+.1f}%" if errs else ""
            if metis is not None and metis.get("iteration_ms") is not None:
                e = (meas - metis["iteration_ms"]) / meas
                mt_ape.append(abs(e))
                metis_err_s = pct(e)
                # As the Metis search scores the plan: the least of its visits' costs.
                sl = metis.get("search_label") or {}
                scored = min(x for x in (metis["iteration_ms"], sl.get("iteration_ms")) if x is not None)
                ms_ape.append(abs((meas - scored) / meas))
            if metis is not None and metis.get("ranks"):
                by_rank = {x["rank"]: x["memory_mb"] for x in metis["ranks"]}
                errs = []
                for x in ranks:
                    if x["rank"] in by_rank and x["peak_memory_mb"] > 0:
                        errs.append((x["peak_memory_mb"] - by_rank[x["rank"]]) / x["peak_memory_mb"])
                mm_ape += [abs(e) for e in errs]
                metis_merr_s = pct(max(errs, key=abs)) if errs else ""
        rows.append(shown)
        out.append(f"| {shown} | {meta.get('model', '')} | {stages} | {p['batches']} x {p['gbs']} | "
                   f"{p.get('zero_stage', 0)} | {p.get('recompute', 'none')} | {p.get('schedule', '1f1b')}{(' v' + str(p['virtual_stages'])) if p.get('virtual_stages', 1) > 1 else ''}{settings_suffix(p)} | "
                   f"{sim['iteration_ms']:.1f} | {meas_s} | {err_s} | {fmt_list(pred_alloc)} | {mm_s} | {merr_s} | "
                   f"{metis_ms_s} | {metis_err_s} | {metis_mem_s} | {metis_merr_s} |")
    out.append("")
    if t_ape:
        out.append(f"Iteration-time MAPE over {len(t_ape)} plans: {100 * sum(t_ape) / len(t_ape):.2f}% "
                   f"(worst {100 * max(t_ape):.1f}%).")
        out.append(f"Per-rank peak-memory MAPE over {len(m_ape)} ranks: {100 * sum(m_ape) / len(m_ape):.2f}% "
                   f"(worst {100 * max(m_ape):.1f}%).")
        if u_ape:
            out.append(f"Device memory in use (CUDA context, NCCL included) MAPE over {len(u_ape)} ranks: "
                       f"{100 * sum(u_ape) / len(u_ape):.2f}%.")
    if mt_ape or mm_ape:
        line = "Metis formula: "
        line += f"iteration-time MAPE over {len(mt_ape)} plans: {mape_line(mt_ape)}" if mt_ape else \
            "iteration time: no plan costed"
        line += f"; per-rank memory MAPE over {len(mm_ape)} ranks: {mape_line(mm_ape)}." if mm_ape else \
            "; memory: no plan sized."
        out.append(line)
        if ms_ape != mt_ape:
            out.append(f"Metis as its search scores plans (the least of its visits' costs: a plan visited first "
                       f"labelled as one stage is costed on its first stage only, the reference's quirk): "
                       f"iteration-time MAPE over {len(ms_ape)} plans: {mape_line(ms_ape)}.")
    elif t_ape and not any_metis:
        out.append("Metis formula: not run in this folder (no NAME.metis.json); re-score with --table DIR --resimulate.")
    for n in metis_notes:
        out.append(f"- {n}")
    out.append("\nerror = (measured - predicted) / measured. Measured: median iteration of `hetplan replay` "
               "(bf16 weights, fp32 main gradients, masters and Adam states) and each rank's peak allocated "
               "memory; predicted: `hetplan simulate` from the profiles alone. Metis: `hetplan simulate "
               "--cost-model metis`, the cost and memory demand of `search --cost-model metis` for the plan "
               "(every stage costed; where its search also visits the plan labelled as one stage, that cost is "
               "shown as \"search:\"); its memory is the stage's demand (5 x the profiled layer memory), given to "
               "each rank of the stage; it does not model ZeRO, recomputation or the schedule.")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite")
    ap.add_argument("--table")
    ap.add_argument("--resimulate", action="store_true")
    ap.add_argument("--bin", default="build/hetplan")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--out")
    ap.add_argument("--report", help="also write the table here (default: logs/validate_<suite>.md)")
    ap.add_argument("--profile", action="store_true", help="profile the suite's models first")
    ap.add_argument("--machine", default=os.environ.get("HETPLAN_MACHINE", platform.node()))
    a = ap.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    if bool(a.suite) == bool(a.table):
        sys.exit("validate_plans: give --suite SUITE.json (a run) or --table DIR (a past run's table)")

    if a.table:
        work = a.table
        if not os.path.isdir(work):
            sys.exit(f"validate_plans: --table {work}: no such run folder")
        info = json.load(open(f"{work}/run.json")) if os.path.exists(f"{work}/run.json") else {}
        if a.resimulate:
            for f in sorted(glob.glob(f"{work}/*.plan.json")):
                name = os.path.basename(f)[: -len(".plan.json")]
                meta = json.load(open(f"{work}/{name}.meta.json"))
                run([a.bin, "simulate", "--plan", f, "--hf-config", meta["hf_config"], "--held-sends",
                     "--json", f"{work}/{name}.sim.json"])
                simulate_metis(a.bin, f, work, name)
        text = table(work, info.get("suite", "suite"), info.get("machine", "unknown"))
        print(text)
        if a.report:
            open(a.report, "w").write(text)
        return

    suite = load_suite(a.suite)
    suite_name = os.path.splitext(os.path.basename(a.suite))[0]
    work = a.out or f"logs/validate/{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{suite_name}"
    os.makedirs(work, exist_ok=True)
    log = f"{work}/log.txt"
    json.dump({"suite": suite_name, "machine": a.machine, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "iters": a.iters, "warmup": a.warmup}, open(f"{work}/run.json", "w"), indent=1)
    if a.profile:
        profile_models(suite, a.bin, log)
    only = set(filter(None, a.only.split(",")))
    plans = [p for p in suite["plans"] if not only or p["name"] in only]
    json.dump([p["name"] for p in plans], open(f"{work}/order.json", "w"))
    # Predictions first, all of them, before anything is measured.
    for p in plans:
        m = suite["models"][p["model"]]
        f = f"{work}/{p['name']}.plan.json"
        plan = searched_plan(suite, p, a.bin, work, log) if "search" in p else plan_file(suite, p)
        json.dump(plan, open(f, "w"), indent=1)
        json.dump({"model": p["model"], "hf_config": m["hf_config"], "note": p.get("note", "")},
                  open(f"{work}/{p['name']}.meta.json", "w"), indent=1)
        # --held-sends: replay's pipeline sends keep their tensors until the stage's last op (sim/memory_model.h).
        run([a.bin, "simulate", "--plan", f, "--hf-config", m["hf_config"], "--held-sends", "--json",
             f"{work}/{p['name']}.sim.json"], log)
        simulate_metis(a.bin, f, work, p["name"], log)
    for p in plans:
        m = suite["models"][p["model"]]
        f = f"{work}/{p['name']}.plan.json"
        schedule = json.load(open(f)).get("schedule", "1f1b")
        run([a.bin, "replay", "--plan", f, "--hf-config", m["hf_config"], "--iters", str(a.iters), "--warmup",
             str(a.warmup), "--schedule", schedule, "--out", f"{work}/{p['name']}.replay.json"],
            log, check=False)
    text = table(work, suite_name, a.machine)
    print(text)
    open(f"{work}/table.md", "w").write(text)
    report = a.report or f"logs/validate_{suite_name}.md"
    open(report, "w").write(text)
    print(f"validate_plans: table in {work}/table.md and {report}", file=sys.stderr)


if __name__ == "__main__":
    main()
