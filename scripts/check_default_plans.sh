#!/usr/bin/env bash
# Checks the default search's best plan on three inputs, as a practitioner would before running it:
#   demo   the demo's 16 A100/V100 (4-GPU nodes), 10 layers, gbs 64, analytic profiles;
#   llama  8 H100 + 8 A100 (8-GPU nodes), a Llama-shaped 34-layer model (hidden 4096, sequence 4096),
#          gbs 512, analytic profiles;
#   gbs96  12 A100 + 12 V100 (4-GPU nodes), 10 layers, gbs 96 (micro-batches not powers of two).
# For each: `search --json`, then `simulate` on its best plan, and these checks, each printed:
#   fits      simulate: every rank fits its own GPU's memory;
#   tp        every tp group is one host's consecutive local GPUs (inside one node);
#   layers    the partition starts at 0, ends at the model's layers, every stage non-empty;
#   gpus      the stages use every GPU of the hostfile;
#   samples   m x micro-batch = gbs, no replica without a sample, and simulate's tokens/s x iteration
#             time / sequence length = gbs (every sample trained and counted);
#   cost      the search's cost equals simulate's iteration time within 1e-9 relative.
# Prints one line per check and exits 1 if any fails.
#
#   scripts/check_default_plans.sh [--bin build/hetplan] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/hetplan
out=logs/check_default_plans
while (($#)); do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "check_default_plans: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -x $bin ]] || { echo "check_default_plans: no $bin (run scripts/build.sh)" >&2; exit 2; }
mkdir -p "$out"
cf=hostfiles/clusterfile.json
status=0

# check NAME LAYERS GBS HOSTFILE PROFILES [search args...]
check() {
  local name=$1 layers=$2 gbs=$3 hostfile=$4 profiles=$5; shift 5
  "$bin" search -q --hostfile "$hostfile" --clusterfile "$cf" --profiles "$profiles" --num_layers "$layers" \
    --gbs "$gbs" "$@" --json "$out/$name.plan.json" >"$out/$name.search.txt"
  "$bin" simulate --plan "$out/$name.plan.json" --json "$out/$name.sim.json" >"$out/$name.simulate.txt"
  echo "== $name: $(sed -n 1p "$out/$name.search.txt")"
  echo "   best: $(sed -n 4p "$out/$name.search.txt")"
  python3 - "$out/$name.plan.json" "$out/$name.sim.json" "$hostfile" <<'PY' || status=1
import json, sys
plan = json.load(open(sys.argv[1]))["best"]
sim = json.load(open(sys.argv[2]))
gpus = sum(int(tok.split("=")[1]) for line in open(sys.argv[3]) for tok in line.split() if tok.startswith("slots="))
ok = True
def report(check, good, detail):
    global ok
    ok = ok and good
    print(f"   {check:8s} {'ok' if good else 'FAILED'}: {detail}")
worst = max(sim["ranks"], key=lambda r: r["total"] / r["capacity"])
report("fits", sim["fits"] and all(r["fits"] for r in sim["ranks"]),
       f"{len(sim['ranks'])} ranks; fullest rank {worst['rank']} at {worst['total'] / 2**30:.1f} of {worst['capacity'] / 2**30:.1f} GiB")
groups = {}
for r in plan["ranks"]:
    groups.setdefault((r["stage"], r["dp_index"]), []).append(r)
inside = all(len({r["host"] for r in g}) == 1 and
             all(b["local_gpu"] == a["local_gpu"] + 1 for a, b in zip(g, g[1:])) for g in groups.values())
report("tp", inside, f"{len(groups)} tp groups, tp degrees {sorted({len(g) for g in groups.values()})}")
part = plan["layer_partition"]
layers = plan["model"]["num_layers"]
report("layers", part[0] == 0 and part[-1] == layers and all(a < b for a, b in zip(part, part[1:])),
       f"partition {part} of {layers} layers")
report("gpus", sum(plan["device_groups"]) == gpus == len(plan["ranks"]),
       f"{sum(plan['device_groups'])} of the hostfile's {gpus} GPUs")
m, gbs = plan["batches"], plan["gbs"]
b = gbs // m
dps = [s[0] for s in plan["strategies"]]
trained = sim["tokens_per_s"] * sim["iteration_ms"] / 1000 / plan["model"]["sequence_length"]
report("samples", m * b == gbs and all(dp <= b for dp in dps) and abs(trained - gbs) <= 1e-6 * gbs,
       f"{m} micro-batches of {b} samples = gbs {gbs}; dp per stage {dps} (each replica at least one sample); "
       f"simulate's tokens/s x iteration time / sequence = {trained:.6f} samples")
rel = abs(plan["cost"] - sim["iteration_ms"]) / sim["iteration_ms"]
report("cost", rel <= 1e-9, f"search {plan['cost']!r} ms, simulate {sim['iteration_ms']!r} ms, relative difference {rel:.1e}")
sys.exit(0 if ok else 1)
PY
}

p=$out/profiles
[[ -d $p/demo ]] || "$bin" gen-profiles --analytic 10 64 --types A100,V100 --max-tp 16 --out "$p/demo" >/dev/null
check demo 10 64 hostfiles/a100_v100_16.hostfile "$p/demo"

[[ -d $p/llama ]] || "$bin" gen-profiles --analytic 34 64 --types A100,H100 --max-tp 8 --hidden-size 4096 \
  --seq-len 4096 --out "$p/llama" >/dev/null
"$bin" gen-hostfile 8 --types H100,A100 --slots 8 --clusterfile "$cf" --out "$out/h100_a100_16.hostfile" >/dev/null
check llama 34 512 "$out/h100_a100_16.hostfile" "$p/llama" --hidden-size 4096 --sequence-length 4096

"$bin" gen-hostfile 12 --types A100,V100 --slots 4 --clusterfile "$cf" --out "$out/a100_v100_24.hostfile" >/dev/null
check gbs96 10 96 "$out/a100_v100_24.hostfile" "$p/demo"

echo "check_default_plans: $([[ $status == 0 ]] && echo "every check passed" || echo "a check FAILED"); outputs in $out/"
exit "$status"
