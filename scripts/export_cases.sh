#!/usr/bin/env bash
# Every case of `hetplan export --to megatron` and `--to deepspeed`, written into OUTDIR for
# scripts/gpu_export_parser_check.py, which runs the frameworks' own parsers over them.
#
#   scripts/export_cases.sh BIN OUTDIR        (BIN: the hetplan binary, e.g. build-nt/hetplan)
#
# Needs nothing outside the checkout (a bare clone): the profiles come from `gen-profiles --analytic`, the
# models from tests/data/hf. For each model and cluster, `hetplan search --hf-config` writes a plan that
# carries its model (architecture, rope_scaling, precision); each case then sets the plan's parallel layout
# and training setting (strategies, device groups, layer partition, micro-batches, ZeRO stage, recompute,
# offload) to the branch of the exporter it covers, and `hetplan export` writes the file.
#
# OUTDIR/manifest.json lists every case: its file, the plan it came from, dp/tp/pp, world size (dp*tp*pp),
# the nodes and GPUs per node torchrun starts, and the environment the launch needs: the variables the
# emitted script must export (CUDA_DEVICE_MAX_CONNECTIONS=1 where tp > 1 without Megatron-FSDP, as
# Megatron's validate_args demands), and those torchrun sets for rank 0 (WORLD_SIZE, RANK, LOCAL_RANK, ...).
# These expectations are written here from the rules, not read from the exports, so the check compares them.
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 BIN OUTDIR" >&2
  exit 2
fi
BIN=$(realpath "$1")
OUT=$2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
HF=$ROOT/tests/data/hf
CLUSTERFILE=$ROOT/hostfiles/clusterfile.json  # 0.0.0.1 V100, 0.0.0.4 A100, 0.0.0.5 H100
rm -rf "$OUT"
mkdir -p "$OUT"/work "$OUT"/plans "$OUT"/megatron "$OUT"/deepspeed
OUT=$(realpath "$OUT")
W=$OUT/work

# Clusters: one hostfile line is one node.
printf '0.0.0.5 slots=8\n' >"$W/h100_1x8.hostfile"
printf '0.0.0.5 slots=8\n0.0.0.5 slots=8\n' >"$W/h100_2x8.hostfile"
printf '0.0.0.1 slots=8\n' >"$W/v100_1x8.hostfile"
printf '0.0.0.4 slots=4\n0.0.0.1 slots=4\n' >"$W/a100_4_v100_4.hostfile"

# Profiles for each model's shape (roofline estimates from the GPU catalogue).
"$BIN" gen-profiles --analytic --types H100,A100,V100 --hf-config "$HF/llama-3.1-8b.json" --seq-len 4096 \
  --max-tp 2 34 4 -o "$W/prof-llama-3.1-8b" >/dev/null
"$BIN" gen-profiles --analytic --types H100,A100,V100 --hf-config "$HF/llama-3.2-3b.json" --seq-len 4096 \
  --max-tp 2 30 4 -o "$W/prof-llama-3.2-3b" >/dev/null
"$BIN" gen-profiles --analytic --types V100 --hidden-size 1600 --seq-len 1024 --vocab-size 50257 \
  --heads 25 --max-tp 2 50 4 -o "$W/prof-gpt2-xl" >/dev/null

# base NAME HOSTFILE PROFILES HF_CONFIG LAYERS GBS SEQ HIDDEN VOCAB HEADS: a searched plan that carries its model.
base() {
  local name=$1 hostfile=$2 prof=$3 hf=$4 layers=$5 gbs=$6 seq=$7 hidden=$8 vocab=$9 heads=${10}
  "$BIN" search --hostfile "$W/$hostfile" --clusterfile "$CLUSTERFILE" --profiles "$W/$prof" --num_layers "$layers" \
    --gbs "$gbs" --sequence_length "$seq" --hidden_size "$hidden" --vocab_size "$vocab" --heads "$heads" \
    --hf-config "$hf" --zero auto --recompute auto -q --json "$W/base-$name.json" >/dev/null
}
base llama31-h100x8 h100_1x8.hostfile prof-llama-3.1-8b "$HF/llama-3.1-8b.json" 34 64 4096 4096 128256 32
base llama31-h100x16 h100_2x8.hostfile prof-llama-3.1-8b "$HF/llama-3.1-8b.json" 34 64 4096 4096 128256 32
base gpt2xl-v100x8 v100_1x8.hostfile prof-gpt2-xl "$HF/gpt2-xl.json" 50 64 1024 1600 50257 25
base llama32-a100v100 a100_4_v100_4.hostfile prof-llama-3.2-3b "$HF/llama-3.2-3b.json" 30 64 4096 3072 128256 24

# case FRAMEWORK NAME BASE 'STRATEGIES' 'GROUPS' 'PARTITION' BATCHES ZERO RECOMPUTE OFFLOAD_OPT OFFLOAD_PARAM WHAT
# STRATEGIES etc. are JSON. The plan keeps the base's model, gbs, cluster and precision.
CASES=$W/cases.tsv
: >"$CASES"
case_() { (IFS=$'\t'; echo "$*") >>"$CASES"; }
L=llama31-h100x8
L16=llama31-h100x16
G=gpt2xl-v100x8
H=llama32-a100v100
# Megatron-LM: ZeRO 0-3 (DDP, distributed optimizer, Megatron-FSDP), tp, pp (even, first/last, layout),
# recompute, fp16 (V100), two GPU types, rope scaling (every Llama-3.1 case), offload, a GPT-2.
case_ megatron m01-z0-dp8 $L '[[8,1]]' '[8]' '[0,34]' 4 0 none 0 0 'ZeRO-0 (DDP), dp 8, bf16, Llama-3.1 rope scaling'
case_ megatron m02-z1-tp2-full $L '[[4,2]]' '[8]' '[0,34]' 4 1 full 0 0 'ZeRO-1 (distributed optimizer), tp 2 + SP, full recompute'
case_ megatron m03-z2-tp2-selective $L '[[4,2]]' '[8]' '[0,34]' 4 2 selective 0 0 'ZeRO-2 (distributed optimizer), tp 2, selective recompute'
case_ megatron m04-z3-fsdp-dp8 $L '[[8,1]]' '[8]' '[0,34]' 4 3 none 0 0 'ZeRO-3 (Megatron-FSDP), dp 8'
case_ megatron m05-z3-fsdp-tp2-selective $L '[[4,2]]' '[8]' '[0,34]' 4 3 selective 0 0 'ZeRO-3 (Megatron-FSDP), tp 2, selective recompute'
case_ megatron m06-pp2-tp2-uneven $L16 '[[4,2],[4,2]]' '[8,8]' '[0,16,34]' 8 1 full 0 0 'pp 2 x tp 2 x dp 4 on two nodes, first/last stage layers 15/17'
case_ megatron m07-pp4-layout $L16 '[[2,2],[2,2],[2,2],[2,2]]' '[4,4,4,4]' '[0,7,16,26,34]' 8 0 none 0 0 'pp 4, uneven middle stages: --pipeline-model-parallel-layout'
case_ megatron m08-pp2-even-z1 $L16 '[[8,1],[8,1]]' '[8,8]' '[0,17,34]' 8 1 none 0 0 'pp 2 even split, dp 8, ZeRO-1'
case_ megatron m09-offload-z1 $L '[[8,1]]' '[8]' '[0,34]' 4 1 none 1 0 'ZeRO-1 with the optimizer offloaded (a note for Megatron)'
case_ megatron m10-v100-fp16-gpt2 $G '[[8,1]]' '[8]' '[0,50]' 4 1 selective 0 0 'V100: fp16 with loss scaling; GPT-2 XL (learned positions, LayerNorm, tied)'
case_ megatron m11-a100-v100-uniform $H '[[4,1],[4,1]]' '[4,4]' '[0,18,30]' 8 1 none 0 0 'two GPU types (A100, V100) with uniform (dp, tp), uneven split, fp16'
# DeepSpeed: ZeRO 0-3, offload optimizer / param, fp16 (V100) and bf16, activation checkpointing, pipeline.
case_ deepspeed d01-z0-bf16 $L '[[8,1]]' '[8]' '[0,34]' 4 0 none 0 0 'ZeRO-0, bf16'
case_ deepspeed d02-z1-bf16 $L '[[8,1]]' '[8]' '[0,34]' 4 1 none 0 0 'ZeRO-1, bf16'
case_ deepspeed d03-z2-bf16-full $L '[[8,1]]' '[8]' '[0,34]' 4 2 full 0 0 'ZeRO-2, bf16, activation checkpointing'
case_ deepspeed d04-z3-bf16 $L '[[8,1]]' '[8]' '[0,34]' 4 3 none 0 0 'ZeRO-3, bf16'
case_ deepspeed d05-z2-offload-opt $L '[[8,1]]' '[8]' '[0,34]' 4 2 none 1 0 'ZeRO-2, optimizer offloaded to CPU'
case_ deepspeed d06-z3-offload-opt-param $L '[[8,1]]' '[8]' '[0,34]' 4 3 selective 1 1 'ZeRO-3, optimizer and parameters offloaded to CPU'
case_ deepspeed d07-v100-fp16-z1 $G '[[8,1]]' '[8]' '[0,50]' 4 1 none 0 0 'V100: fp16 block with dynamic loss scaling'
case_ deepspeed d08-pp2-z1 $L16 '[[8,1],[8,1]]' '[8,8]' '[0,17,34]' 8 1 full 0 0 'pipeline section: 2 stages, ZeRO-1'
case_ deepspeed d09-a100-v100-fp16 $H '[[4,1],[4,1]]' '[4,4]' '[0,18,30]' 8 0 none 0 0 'two GPU types, pipeline, fp16'
case_ deepspeed d10-tp2-z2 $L '[[4,2]]' '[8]' '[0,34]' 4 2 none 0 0 'tp 2 from the model code: batch keys count dp 4'

python3 - "$OUT" "$CASES" "$BIN" <<'EOF'
import json, subprocess, sys, os
out, cases, binary = sys.argv[1:4]
work = os.path.join(out, "work")
manifest = {"generator": "scripts/export_cases.sh", "cases": []}
for line in open(cases):
    line = line.rstrip("\n")
    if not line:
        continue
    fw, name, base, strategies, groups, partition, batches, zero, recompute, off_opt, off_param, what = line.split("\t")
    plan = json.load(open(os.path.join(work, f"base-{base}.json")))["best"]
    for k in ("cost", "ranks", "num_repartition"):
        plan.pop(k, None)
    plan["strategies"] = json.loads(strategies)
    plan["device_groups"] = json.loads(groups)
    plan["layer_partition"] = json.loads(partition)
    plan["batches"] = int(batches)
    plan["zero_stage"] = int(zero)
    plan["recompute"] = recompute
    plan["offload_optimizer"] = off_opt == "1"
    plan["offload_params"] = off_param == "1"
    pp = len(plan["strategies"])
    dp, tp = plan["strategies"][0]
    plan_path = os.path.join(out, "plans", name + ".json")
    json.dump(plan, open(plan_path, "w"), indent=1)
    folder = os.path.join(out, fw, name)
    r = subprocess.run([binary, "export", "--plan", plan_path, "--to", fw, "--out", folder],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"export_cases.sh: {name}: hetplan export exited {r.returncode}: {r.stderr.strip()}")
    nodes = [l.split() for l in open(plan["hostfile"]) if l.strip() and not l.startswith("#")]
    nnodes, per_node = len(nodes), int(nodes[0][1].split("=")[1])
    world = dp * tp * pp
    assert nnodes * per_node == world, name
    script_env = {}
    if fw == "megatron" and tp > 1 and int(zero) != 3:
        script_env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    entry = {
        "name": name, "framework": fw, "what": what,
        "file": os.path.relpath(os.path.join(folder, "megatron_args.sh" if fw == "megatron" else "ds_config.json"), out),
        "plan": os.path.relpath(plan_path, out), "model": plan["model"].get("architecture", {}).get("name", "GPT"),
        "dp": dp, "tp": tp, "pp": pp, "world_size": world, "nnodes": nnodes, "nproc_per_node": per_node,
        "zero_stage": int(zero), "recompute": recompute,
        "offload_optimizer": off_opt == "1", "offload_params": off_param == "1",
        "script_env": script_env,
        # What torchrun sets for the first process of node 0 (the check runs as that rank).
        "torchrun_env": {"WORLD_SIZE": str(world), "RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0",
                         "LOCAL_WORLD_SIZE": str(per_node), "NODE_RANK": "0"},
    }
    if fw == "deepspeed":
        entry["data_parallel_size"] = dp  # what DeepSpeed's batch keys count (train_batch_size = micro x gas x dp)
    manifest["cases"].append(entry)
json.dump(manifest, open(os.path.join(out, "manifest.json"), "w"), indent=1)
print(f"wrote {len(manifest['cases'])} cases to {out} (manifest.json)")
EOF
