#!/usr/bin/env bash
# Builds (if needed, into build-fuzz/, with clang 14) and runs the libFuzzer
# targets of tests/fuzz/ (one per input reader, an exported plan folder, and
# whole CLI commands), each for SECONDS (default 60),
# then prints each target's execution count and result.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
# Seeds come from the project's own files (hostfiles/, profiles/H200,
# logs/validate plans, tests/data/hf); the growing corpus stays in
# build-fuzz/corpus/<target>/. Crash, out-of-memory and timeout inputs land in
# build-fuzz/findings/<target>/; reproduce one with
#   build-fuzz/tests/fuzz/<target> <file>
# The inputs kept in tests/fuzz/findings/<target>/ are replayed first, as
# regression inputs. Exit status 1 when any of them, or any new input, fails.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-60}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(fuzz_cluster fuzz_profiles fuzz_plan_file fuzz_hf_config fuzz_gpu_spec fuzz_exported_plan
  fuzz_cli)

cxx=${HETPLAN_FUZZ_CXX:-clang++-14}
if ! command -v "$cxx" >/dev/null || [[ ! -d /usr/lib/llvm-14/lib/clang ]]; then
  scripts/install_deps.sh --no-torch --fuzz
fi
b=build-fuzz
cmake -S . -B $b -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
  -DHETPLAN_FUZZ=ON -DHETPLAN_WITH_TORCH=OFF -DHETPLAN_BUILD_TESTS=OFF >/dev/null
cmake --build $b --target hetplan_fuzz --parallel "$(nproc)"

# Seed corpora from the project's files.
seeds=$b/seeds
rm -rf "$seeds"
mkdir -p "$seeds"/{fuzz_cluster,fuzz_profiles,fuzz_plan_file,fuzz_hf_config,fuzz_gpu_spec,fuzz_exported_plan,fuzz_cli}
for h in hostfiles/*.hostfile; do
  { cat "$h"; printf '\0'; cat hostfiles/clusterfile.json; } >"$seeds/fuzz_cluster/$(basename "$h")"
done
profile_seed() {  # out, layer check ("" for none), files of profiles/H200...
  local out=$1 layers=$2 f
  shift 2
  {
    [[ -z "$layers" ]] || printf '@%s\0' "$layers"
    for f in "$@"; do printf '%s\0' "$f"; cat "profiles/H200/$f"; printf '\0'; done
  } >"$seeds/fuzz_profiles/$out"
}
profile_seed one "" DeviceType.H200_tp1_bs1.json
profile_seed two_checked 10 DeviceType.H200_tp1_bs1.json DeviceType.H200_tp1_bs2.json
profile_seed four_readme "" DeviceType.H200_tp1_bs1.json DeviceType.H200_tp1_bs2.json \
  DeviceType.H200_tp2_bs1.json DeviceType.H200_tp2_bs2.json README.md
# (No `find | head` pipeline: under pipefail, head closing early fails the script.)
mapfile -t plans < <(find logs/validate -name 'plan[0-9]*.json' | sort)
for p in "${plans[@]:0:12}"; do
  cp "$p" "$seeds/fuzz_plan_file/$(echo "$p" | tr / _)"
done
cp tests/data/hf/*.json "$seeds/fuzz_hf_config/"
cp sim/data/gpus.json "$seeds/fuzz_gpu_spec/"
# An exported folder: a plan for the 8 H200 of hostfiles/h200_8.hostfile naming its files relatively, then
# the hostfile, the clusterfile, a calibration file and two profiles.
h200_plan='{"node_sequence": ["H200"], "device_groups": [8], "strategies": [[4, 2]], "batches": 2,
 "layer_partition": [0, 10], "gbs": 16, "hostfile": "hostfile", "clusterfile": "clusterfile.json",
 "profile_dir": "profiles", "model": {"num_layers": 10, "hidden_size": 2560, "sequence_length": 1024,
 "vocab_size": 50257, "attention_heads": 32}}'
{
  printf '%s\0' "$h200_plan"
  cat hostfiles/h200_8.hostfile; printf '\0'
  cat hostfiles/clusterfile.json; printf '\0'
  printf '{"host": {"h2d_gbs": 50}}\0'
  for f in DeviceType.H200_tp2_bs1.json DeviceType.H200_tp2_bs2.json; do
    printf '%s\0' "$f"; cat "profiles/H200/$f"; printf '\0'
  done
} >"$seeds/fuzz_exported_plan/h200"
# Whole commands: the fixtures are h (8 H200), c.json, p/ (profiles/H200); f1.. are the input's files.
cli_seed() {  # name, argument list, contents of f1...
  local name=$1 args=$2 f
  shift 2
  { printf '%s' "$args"; for f in "$@"; do printf '\0%s' "$f"; done; } >"$seeds/fuzz_cli/$name"
}
cli_seed search "search --hostfile_path h --clusterfile_path c.json --profile_data_path p --num_layers 10 --gbs 16 --top 2 --time-budget 2"
cli_seed metis "search --cost-model metis --hostfile_path h --clusterfile_path c.json --profile_data_path p --num_layers 10 --gbs 16"
cli_seed simulate "simulate --plan f1 --trace t.json" "$h200_plan"
cli_seed export "export --plan f1 --to torchrun --hostfile h --clusterfile c.json --out tr" "$h200_plan"
cli_seed megatron "export --plan f1 --to megatron --hostfile h --clusterfile c.json --out m" "$h200_plan"
cli_seed whatif "whatif --gpu A100 --gpus 8 --rows DDP --export w --json w.json"
cli_seed gpu_spec "whatif --gpu-spec f1 --gpu H100 --gpus 8 --seq 512" "$(cat sim/data/gpus.json)"
cli_seed gen_hostfile "gen-hostfile 8 --slots 4 --out hf"
cli_seed gen_profiles "gen-profiles --analytic 10 8 --types A100 --max-tp 2 --out gp"

declare -A max_len=([fuzz_cluster]=4096 [fuzz_profiles]=32768 [fuzz_plan_file]=16384 [fuzz_hf_config]=4096
  [fuzz_gpu_spec]=32768 [fuzz_exported_plan]=65536 [fuzz_cli]=32768)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p $b/logs
rows=() found=0
for t in "${targets[@]}"; do
  corpus=$b/corpus/$t findings=$b/findings/$t
  mkdir -p "$corpus" "$findings"
  stamp=$b/logs/$t.start
  touch "$stamp"
  # The inputs saved in tests/fuzz/findings/ first: each once crashed a reader.
  stale=0
  for f in tests/fuzz/findings/"$t"/*; do
    [[ -f "$f" ]] || continue
    "$b/tests/fuzz/$t" "$f" >"$b/logs/$t.replay.log" 2>&1 || { stale=$((stale + 1)); echo "fuzz: $f still crashes $t"; }
  done
  echo "fuzz: $t for ${secs}s (log $b/logs/$t.log)"
  # -fork=1 with -ignore_*: one run records several crashes, not just the first.
  rc=0
  "$b/tests/fuzz/$t" -fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 \
    -max_total_time="$secs" -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 \
    -max_len="${max_len[$t]}" -dict="tests/fuzz/dict/$t.dict" -artifact_prefix="$findings/" \
    "$corpus" "$seeds/$t" >"$b/logs/$t.log" 2>&1 || rc=$?
  # The last status line "#N ..." carries the execution count.
  runs=$({ grep -oE "^#[0-9]+" "$b/logs/$t.log" || true; } | tail -1 | tr -d "#")
  new=$(find "$findings" -type f -newer "$stamp" | wc -l)
  result=""
  if ((stale > 0)); then
    result="$stale saved input(s) of tests/fuzz/findings/$t still crash; "
    found=1
  fi
  if ((new > 0)); then
    result+="$new finding(s) in $findings/"
    found=1
  elif ((rc != 0)); then
    result="fuzzer exited $rc (see log)"
    found=1
  else
    result+="no new finding"
  fi
  rows+=("$(printf '%-16s %12s  %s' "$t" "${runs:-?}" "$result")")
done

echo
printf '%-16s %12s  %s\n' target executions result
for r in "${rows[@]}"; do echo "$r"; done
exit $found
