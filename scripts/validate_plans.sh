#!/usr/bin/env bash
# Validates plans on real GPUs: searches the K cheapest distinct plans for a
# 1-node 4 x H200 hostfile, replays each with `hetplan replay`, simulates each
# with `hetplan simulate`, and prints a Markdown table of plan, Metis
# prediction, simulation, measurement, errors and memory, saved under logs/.
#
#   scripts/validate_plans.sh [--profiles DIR] [--top K] [--gbs N] [--bin PATH] [--iters N]
#                             [--hostfile FILE] [--clusterfile FILE]
#   scripts/validate_plans.sh --table logs/validate/<stamp> [--resimulate] [--bin PATH]
#
# --table only prints the table of a saved run (plans without a replay are
# "not measured"); with --resimulate it first re-runs `hetplan simulate` on
# the saved plans, to score a past measurement with the current simulator.
#
# Default profiles: profiles/H200 (measured; run `hetplan profile` to redo
# them). Emulated device types (a clusterfile's "device_types", e.g.
# --hostfile hostfiles/h200_1_h200-33sm_1.hostfile --clusterfile
# hostfiles/clusterfile_h200_emulated.json with a profile folder holding both
# types) need no more: each plan records its hostfile and clusterfile, and
# replay runs each rank of an emulated type in its SM partition. Needs python3 for the table. On the GPU machines, build first with
# scripts/gpu_build.sh and pass --bin build-gpu/hetplan.
set -euo pipefail
cd "$(dirname "$0")/.."
profiles=profiles/H200 top=6 gbs=64 bin=build/hetplan iters=10 table="" resimulate=0
hostfile=hostfiles/h200_4.hostfile clusterfile=hostfiles/clusterfile.json
while (($#)); do
  case "$1" in
    --profiles) profiles=$2; shift 2 ;;
    --top) top=$2; shift 2 ;;
    --gbs) gbs=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --hostfile) hostfile=$2; shift 2 ;;
    --clusterfile) clusterfile=$2; shift 2 ;;
    --table) table=$2; shift 2 ;;
    --resimulate) resimulate=1; shift ;;
    *) echo "validate_plans: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -f scripts/gpu_env.sh ]] && source scripts/gpu_env.sh
if [[ -n "$table" ]]; then
  work=$table
  [[ -d "$work" ]] || { echo "validate_plans: --table $work: no such run folder" >&2; exit 2; }
  if ((resimulate)); then
    for plan in "$work"/plan*.json; do
      name=$(basename "$plan" .json)
      [[ "$name" =~ ^plan[0-9]+$ ]] || continue
      "$bin" simulate --plan "$plan" --json "$work/$name.sim.json" >/dev/null
    done
  fi
else
stamp=$(date -u +%Y%m%d-%H%M%S)
work=logs/validate/$stamp
mkdir -p "$work"

"$bin" search -q --cost-model metis --hostfile_path "$hostfile" --clusterfile_path "$clusterfile" --profile_data_path "$profiles" \
  --num_layers 10 --gbs "$gbs" --top 60 --reject-dropped-layers --json "$work/search.json" >/dev/null
# The K cheapest plans with distinct stage shapes (device groups and strategies) first, then the rest.
python3 - "$work" "$top" <<'PY'
import json, sys
work, k = sys.argv[1], int(sys.argv[2])
top = json.load(open(f"{work}/search.json"))["top"]
seen, picked = set(), []
for p in top:
    key = (tuple(p["device_groups"]), tuple(map(tuple, p["strategies"])))
    if key not in seen:
        seen.add(key); picked.append(p)
for p in top:
    if len(picked) >= k: break
    if p not in picked: picked.append(p)
for i, p in enumerate(picked[:k]):
    json.dump(p, open(f"{work}/plan{i}.json", "w"), indent=1)
PY

for plan in "$work"/plan*.json; do
  name=$(basename "$plan" .json)
  echo "== $name" >&2
  "$bin" simulate --plan "$plan" --json "$work/$name.sim.json" >/dev/null
  "$bin" replay --plan "$plan" --iters "$iters" --warmup 3 --schedule 1f1b --dtype bf16 \
    --out "$work/$name.replay.json" 2>&1 | tail -4 >&2 || echo "replay of $name failed" >&2
done

fi

python3 - "$work" <<'PY' | tee "$work/table.md" > logs/validate_plans.md
import json, os, re, sys, glob
work = sys.argv[1]
rows, ape_metis, ape_sim = [], [], []
print(f"## Plans on 4 x H200: predicted vs measured ({os.path.basename(work)})\n")
print("| plan | device groups | (dp, tp) | batches | layers | Metis ms | simulated ms | measured ms (spread) | Metis error | sim error | peak MB per rank |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
plans = [f for f in glob.glob(f"{work}/plan*.json") if re.fullmatch(r"plan\d+\.json", os.path.basename(f))]
for f in sorted(plans, key=lambda f: int(re.findall(r"\d+", os.path.basename(f))[0])):
    name = os.path.basename(f)[:-5]
    p = json.load(open(f))
    sim = json.load(open(f"{work}/{name}.sim.json"))["iteration_ms"]
    rp = f"{work}/{name}.replay.json"
    if os.path.exists(rp):
        r = json.load(open(rp))
        meas = r["iteration_ms"]["median"]; spread = r["iteration_ms"]["spread"]
        mem = "/".join(f"{x['peak_memory_mb']:.0f}" for x in r["ranks"])
        e1 = (meas - p["cost"]) / meas; e2 = (meas - sim) / meas
        ape_metis.append(abs(e1)); ape_sim.append(abs(e2))
        m, s1, s2 = f"{meas:.1f} ({100*spread:.1f}%)", f"{100*e1:+.1f}%", f"{100*e2:+.1f}%"
    else:
        m, s1, s2, mem = "not measured", "", "", ""
    st = " ".join(f"({a},{b})" for a, b in p["strategies"])
    print(f"| {name} | {p['device_groups']} | {st} | {p['batches']} | {p['layer_partition']} | {p['cost']:.1f} | {sim:.1f} | {m} | {s1} | {s2} | {mem} |")
if ape_metis:
    print(f"\nMAPE over {len(ape_metis)} plans: Metis {100*sum(ape_metis)/len(ape_metis):.1f}%, "
          f"simulator {100*sum(ape_sim)/len(ape_sim):.1f}%.")
print("\nerror = (measured - predicted) / measured. Measured: median iteration of `hetplan replay` "
      "(bf16, 1F1B, Adam), all ranks on the local H200s.")
PY
echo "validate_plans: table in $work/table.md and logs/validate_plans.md" >&2
