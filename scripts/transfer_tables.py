#!/usr/bin/env python3
"""Issue 32's transfer and analytic validation tables, the CPU part: from what
scripts/gpu_transfer_validate.sh measured on each GPU kind (unpacked into the
working tree: logs/validate/transfer/measured-<TYPE>/ with the replays, and
profiles/transfer/measured-<MODEL>-<TYPE>/ with the profiles and probes), it
  1. derives each model's profiles from one GPU type to the others
     (`hetplan gen-profiles --from`): H200 -> H100, H100 -> H200, and each
     type -> its 66-SM partition, with the probes of both types;
  2. makes analytic profiles of each model (`gen-profiles --analytic
     --hf-config`) for every replayed type;
  3. predicts every replayed plan (logs/validate/transfer/plans/<TYPE>/, written
     before anything was measured) with `hetplan simulate` from each set, and
     the measured same-type profiles as the reference;
  4. writes logs/validate/transfer/tables.md: per plan predicted against
     measured time and per-rank peak memory, and each table's MAPE.

  scripts/transfer_tables.py [--bin build-nt/hetplan] [--root logs/validate/transfer] [--profiles profiles/transfer]
"""
import argparse
import glob
import json
import os
import subprocess
import sys

MiB = 1024.0 * 1024.0
PROFILES = "profiles/transfer"
MODELS = {"gpt": ("gpt2-2560-10l", "scripts/validation/gpt2-2560-10l.json"),
          "llama": ("llama-3.2-1b-8l", "scripts/validation/llama-3.2-1b-8l.json")}


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        print(f"transfer_tables: {' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-2000:]}", file=sys.stderr)
        return False
    return True


def base(t):
    return t.split("-")[0]


def probe_dirs(root, types):
    dirs = []
    for t in types:
        dirs += sorted(glob.glob(f"{root}/measured-{base(t)}/probe"))
    return dirs


def measured_dir(tag, t):
    return f"{PROFILES}/measured-{tag}-{t}"


def derive(binary, tag, src, tgt, root):
    """Profiles of `tgt` from the measured ones of `src`; the folder, or None."""
    src_dir = measured_dir(tag, src)
    if not glob.glob(f"{src_dir}/DeviceType.{src}_tp*_bs*.json"):
        return None
    out = f"{PROFILES}/derived-{tag}-{src}-to-{tgt}"
    probes = ",".join(d for d in probe_dirs(root, [src, tgt]) + [measured_dir(tag, base(tgt))] if os.path.isdir(d))
    cmd = [binary, "gen-profiles", "--from", src_dir, "--from-type", src, "--types", tgt, "--out", out]
    if probes:
        cmd += ["--probes", probes]
    return out if run(cmd) else None


def analytic(binary, tag, cfg, types):
    c = json.load(open(cfg))
    layers = int(c.get("n_layer", c.get("num_hidden_layers"))) + 2
    out = f"{PROFILES}/analytic-{tag}"
    # Replay (LibTorch autograd) adds each micro-batch's gradients in a separate pass, not inside the weight-gradient
    # GEMMs as today's Megatron-LM does (gen-profiles' default): priced as replay runs it.
    ok = run([binary, "gen-profiles", "--analytic", "--hf-config", cfg, "--seq-len", "2048", "--types", ",".join(types),
              "--max-tp", "1", "--no-gradient-accumulation-fusion", str(layers), "4", "--out", out])
    return out if ok else None


def simulate(binary, plan, cfg, profiles, out):
    if not profiles:
        return None
    if not run([binary, "simulate", "--plan", plan, "--hf-config", cfg, "--profiles", profiles, "--json", out]):
        return None
    return json.load(open(out))


def main():
    global PROFILES
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build-nt/hetplan")
    ap.add_argument("--root", default="logs/validate/transfer")
    ap.add_argument("--profiles", default=PROFILES, help="where the measured, derived and analytic profiles are")
    a = ap.parse_args()
    PROFILES = a.profiles
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    root = a.root
    replayed = {}  # type -> [(plan name, replay path)]
    for r in sorted(glob.glob(f"{root}/measured-*/*.replay.json")):
        t, name = os.path.basename(r)[: -len(".replay.json")].split(".", 1)
        replayed.setdefault(t, []).append((name, r))
    if not replayed:
        sys.exit(f"transfer_tables: no replays under {root}/measured-*/ (unpack the device runs first)")
    types = sorted(replayed)
    whole = sorted({base(t) for t in types})
    pred_dir = f"{root}/predictions"
    os.makedirs(pred_dir, exist_ok=True)
    # Which profile sets predict a type: (table, label, folder per model).
    sets = {}
    for tag, (mtag, cfg) in MODELS.items():
        an = analytic(a.bin, mtag, cfg, types)
        for t in types:
            sets.setdefault(t, []).append(("analytic", "analytic", tag, an))
            if "-" not in t:
                sets[t].append(("measured", f"measured {t}", tag, measured_dir(mtag, t)))
            for src in whole:
                if src == t:
                    continue
                if "-" in t and base(t) != src:
                    continue  # a partition from its own base (the other direction is the whole-GPU table)
                sets[t].append(("transfer", f"{src} -> {t}", tag, derive(a.bin, mtag, src, t, root)))
            if "-" in t:
                sets[t].append(("transfer", f"{base(t)} -> {t}", tag, derive(a.bin, mtag, base(t), t, root)))
    tables = {"measured": [], "transfer": [], "analytic": []}
    seen = set()
    for t in types:
        for name, rp in replayed[t]:
            plan = f"{root}/plans/{t}/{name}.plan.json"
            p = json.load(open(plan))
            tag = name.split("-")[0]
            cfg = MODELS[tag][1]
            r = json.load(open(rp))
            meas = r["iteration_ms"]["median"]
            meas_mb = [x["peak_memory_mb"] for x in sorted(r["ranks"], key=lambda x: x["rank"])]
            for table, label, mtag, folder in sets.get(t, []):
                if mtag != tag or (t, name, label) in seen:
                    continue
                seen.add((t, name, label))
                safe = label.replace(" ", "").replace(">", "")
                sim = simulate(a.bin, plan, cfg, folder, f"{pred_dir}/{t}.{name}.{safe}.sim.json")
                if sim is None:
                    tables[table].append((t, name, label, None, meas, None, meas_mb))
                    continue
                pred_mb = [x["allocated_peak"] / MiB for x in sorted(sim["ranks"], key=lambda x: x["rank"])]
                tables[table].append((t, name, label, sim["iteration_ms"], meas, pred_mb, meas_mb))
    machines = {t: open(f).read().strip() for t, f in
                ((os.path.basename(os.path.dirname(f))[len("measured-"):], f) for f in glob.glob(f"{root}/measured-*/MACHINE.txt"))}
    out = ["# Issue 32: transfer and analytic validation (scripts/gpu_transfer_validate.sh, scripts/transfer_tables.py)\n"]
    for t, m in sorted(machines.items()):
        out.append(f"- {t}: {m}")
    out.append("\nPlans: logs/validate/transfer/plans/ (committed before any measurement). error = (measured - predicted)"
               " / measured; memory: predicted allocated_peak against replay's peak allocated per rank.\n")
    goals = {"measured": "reference (same type, measured profiles)", "transfer": "goal: time <= 5%, memory <= 3%",
             "analytic": "goal: time <= 10%, memory <= 5%"}
    for table in ("transfer", "analytic", "measured"):
        rows = tables[table]
        out.append(f"## {table} ({goals[table]})\n")
        out.append("| replayed on | plan | profiles | predicted ms | measured ms | time error | predicted MB | measured MB | memory error |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        t_ape, m_ape = [], []
        for t, name, label, pred, meas, pmb, mmb in rows:
            if pred is None:
                out.append(f"| {t} | {name} | {label} | failed | {meas:.1f} | | | {'/'.join(f'{x:.0f}' for x in mmb)} | |")
                continue
            e = (meas - pred) / meas
            t_ape.append(abs(e))
            errs = [(m - q) / m for m, q in zip(mmb, pmb) if m > 0]
            m_ape += [abs(x) for x in errs]
            worst = max(errs, key=abs) if errs else 0
            out.append(f"| {t} | {name} | {label} | {pred:.1f} | {meas:.1f} | {100 * e:+.1f}% | "
                       f"{'/'.join(f'{x:.0f}' for x in pmb)} | {'/'.join(f'{x:.0f}' for x in mmb)} | {100 * worst:+.1f}% |")
        if t_ape:
            out.append(f"\n{table}: time MAPE over {len(t_ape)} predictions {100 * sum(t_ape) / len(t_ape):.2f}% "
                       f"(worst {100 * max(t_ape):.1f}%); per-rank memory MAPE over {len(m_ape)} "
                       f"{100 * sum(m_ape) / max(1, len(m_ape)):.2f}% (worst {100 * max(m_ape, default=0):.1f}%).\n")
    text = "\n".join(out) + "\n"
    open(f"{root}/tables.md", "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
