#!/usr/bin/env bash
# Hostile inputs through the real binary (issue 36): every case must end with
# exit 0 or 2 (never 3 "internal error", 4, a signal or a hang), within 60 s
# of wall time and 2 GB of peak RSS, and must write nothing outside its
# output folder. Prints a table (case, exit code, wall s, peak RSS MB) and
# "N passed, M failed"; exits 1 when any case failed.
# Usage: scripts/adversarial.sh [HETPLAN_BINARY]   (default: build/hetplan, else build-nt/hetplan)
# Needs /usr/bin/time (Debian package `time`, installed by scripts/install_deps.sh) and python3.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
bin=${1:-}
if [[ -z $bin ]]; then
  for b in build/hetplan build-nt/hetplan; do [[ -x $b ]] && { bin=$b; break; }; done
fi
[[ -n $bin && -x $bin ]] || { echo "adversarial: no hetplan binary (build first, or pass its path)" >&2; exit 2; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
[[ -x /usr/bin/time ]] || { echo "adversarial: /usr/bin/time missing (apt-get install time)" >&2; exit 2; }

max_wall=60 max_rss_mb=2048
W=$(mktemp -d /tmp/hetplan-adversarial.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
H=$repo/hostfiles
CF=$H/clusterfile.json
passed=0 failed=0
failures=()
printf '%-44s %5s %8s %9s  %s\n' case exit wall_s rss_MB result

# run NAME ALLOWED_EXITS CMD...: runs CMD (stdin from /dev/null) under time and timeout.
run() {
  local name=$1 allowed=$2
  shift 2
  local tf=$W/.time
  timeout -s KILL $((max_wall + 10)) /usr/bin/time -f '%e %M' -o "$tf" "$@" </dev/null >"$W/.out" 2>"$W/.err"
  local rc=$?
  local wall rss
  # (time writes "Command exited with non-zero status N" first when the command fails.)
  read -r wall rss < <(tail -n 1 "$tf" 2>/dev/null) || { wall=$max_wall; rss=0; }
  [[ $wall =~ ^[0-9.]+$ ]] || wall=$max_wall
  [[ $rss =~ ^[0-9]+$ ]] || rss=0
  local rss_mb=$((rss / 1024)) verdict=ok
  [[ " $allowed " == *" $rc "* ]] || verdict="exit $rc not in {$allowed}: $(tail -c 300 "$W/.err" | tr '\n' ' ')"
  awk -v w="$wall" -v m="$max_wall" 'BEGIN { exit !(w > m) }' && verdict="over ${max_wall} s"
  ((rss_mb > max_rss_mb)) && verdict="over ${max_rss_mb} MB"
  if [[ $verdict == ok ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); failures+=("$name: $verdict"); fi
  printf '%-44s %5s %8s %9s  %s\n' "$name" "$rc" "$wall" "$rss_mb" "$verdict"
}

# check NAME CONDITION...: a condition on what a case left behind (no wall time or memory).
check() {
  local name=$1
  shift
  if "$@"; then passed=$((passed + 1)); v=ok; else failed=$((failed + 1)); failures+=("$name"); v=FAILED; fi
  printf '%-44s %5s %8s %9s  %s\n' "$name" - - - "$v"
}

hp() { "$bin" "$@"; }

# --- inputs -------------------------------------------------------------------------------------
hp gen-profiles --analytic 10 64 --types A100,V100 --max-tp 16 --out prof >/dev/null
hp search --hostfile_path "$H/a100_v100_16.hostfile" --clusterfile_path "$CF" --profile_data_path prof \
  --num_layers 10 --gbs 64 --top 3 --json plan.json >/dev/null
python3 - <<'EOF'
import json
j = json.load(open("plan.json"))
b = j["best"] if "best" in j else j
def variant(name, **kw):
    v = json.loads(json.dumps(b)); v.update(kw)
    for k in ("model", "gbs", "hostfile", "clusterfile", "profile_dir"):
        if k not in v and k in j: v[k] = j[k]
    json.dump(v, open(name, "w"))
variant("plan_dp8192.json", device_groups=[8192], strategies=[[8192, 1]], node_sequence=["A100"],
        layer_partition=[0, 10], batches=1, gbs=8192)
lp = list(b["layer_partition"]); lp[1] = lp[1] + 1e-7 if len(lp) > 2 else 5.0000001
variant("plan_frac.json", layer_partition=lp)
variant("plan_hostdir.json", hostfile="adir")
variant("plan_a100.json", node_sequence=["A100"], device_groups=[16], strategies=[[16, 1]], layer_partition=[0, 10],
        batches=1, gbs=64, hostfile="h16")
open("big.json", "w").write("[" + " " * (16777567 - 2) + "]")
gpus = [{"name": "G%d" % i, "memory_gb": 80, "memory_bw_gbs": 2000, "link_gbs": 300, "host_link_gbs": 25,
         "sm_count": 100, "peak_tflops": {"bf16": 300}, "source": {"title": "t", "url": "u"}} for i in range(60000)]
json.dump({"gpus": gpus}, open("gpus60k.json", "w"))
json.dump({"gpus": gpus[:10000]}, open("gpus10k.json", "w"))
g = dict(gpus[0]); g["name"] = "FAST"; g["link_gbs"] = 1e6
json.dump({"gpus": [g]}, open("gpus_biglink.json", "w"))
host = "a$(touch${IFS}pwned)'b;c|d`touch${IFS}pwned2`"
open("hq", "w").write(host + " slots=16\n")
json.dump({host: {"instance_type": "A100", "inter_bandwidth": 25, "intra_bandwidth": 300, "memory": 80}},
          open("cq.json", "w"))
EOF
mkdir -p adir
for i in $(seq 4097); do echo "0.0.0.4 slots=1"; done >h4097
printf '0.0.0.4 slots=8\n' >h8
printf '0.0.0.4 slots=8\n0.0.0.4 slots=8\n' >h16
printf '0.0.0.4 slots=8\n0.0.0.4 slots=8\n0.0.0.4 slots=8\n0.0.0.4 slots=8\n0.0.0.4 slots=8\n0.0.0.4 slots=8\n0.0.0.4 slots=8\n0.0.0.4 slots=8\n' >h64
hp gen-profiles --analytic 4096 4 --types A100 --max-tp 8 --hidden-size 1024 --heads 16 --out prof4096 >/dev/null 2>&1 ||
  echo "adversarial: note: 4096-layer profiles not generated" >&2
mkdir -p loopdir && ln -s l2 loopdir/l1 && ln -s l1 loopdir/l2
cp prof/* loopdir/ 2>/dev/null
ln -s selfloop selfloop
mkfifo fifo
mkdir -p fifoprof && cp prof/* fifoprof/ && rm fifoprof/DeviceType.A100_tp1_bs1.json && mkfifo fifoprof/DeviceType.A100_tp1_bs1.json
mkdir -p dirprof && cp prof/* dirprof/ && rm dirprof/DeviceType.A100_tp1_bs1.json && mkdir dirprof/DeviceType.A100_tp1_bs1.json
echo "not a folder" >afile
S=(--hostfile_path "$H/a100_v100_16.hostfile" --clusterfile_path "$CF" --profile_data_path prof --num_layers 10)
# The same with the profile folder last, to be given: "${P[@]}" DIR.
P=(--hostfile_path "$H/a100_v100_16.hostfile" --clusterfile_path "$CF" --num_layers 10 --profile_data_path)

# --- issue 36's cases -------------------------------------------------------------------------
run "search 4097 one-GPU nodes, gbs 4097" "0 2" "$bin" search --hostfile_path h4097 --clusterfile_path "$CF" \
  --profile_data_path prof --num_layers 10 --gbs 4097 --time-budget 20
run "simulate plan dp 8192" "2" "$bin" simulate --plan plan_dp8192.json
run "whatif --gpus 4097" "0 2" "$bin" whatif --gpus 4097 --gpu A100
run "export --out is a file" "2" "$bin" export --plan plan.json --to megatron --out afile
run "export --out /proc/x" "2" "$bin" export --plan plan.json --to megatron --out /proc/x
run "gen-profiles --out /proc/x" "2" "$bin" gen-profiles --analytic 10 8 --types A100 --out /proc/x
run "whatif --export /proc/x" "2" "$bin" whatif --gpu A100 --gpus 8 --rows DDP --export /proc/x
run "export torchrun" "0" "$bin" export --plan plan.json --to torchrun --out tr
run "re-export torchrun folder into itself" "0" "$bin" export --plan tr/plan.json --to torchrun --out tr
run "exported plan from another cwd" "0" bash -c "cd / && '$bin' simulate --plan '$W/tr/plan.json'"
run "profile folder with l1 -> l2 -> l1" "0" "$bin" search "${P[@]}" loopdir --gbs 64
run "--profiles itself a loop" "2" "$bin" search --hostfile_path "$H/a100_v100_16.hostfile" --clusterfile_path "$CF" \
  --profile_data_path selfloop --num_layers 10 --gbs 64
run "gen-profiles --samples a loop" "2" "$bin" gen-profiles 10 8 --samples selfloop --out gp
run "plan whose hostfile is a directory" "2" "$bin" simulate --plan plan_hostdir.json
run "search 4096 layers, gbs 65536, 8 GPUs, 5 s" "0 2" "$bin" search --hostfile_path h8 --clusterfile_path "$CF" \
  --profile_data_path prof4096 --num_layers 4096 --gbs 65536 --time-budget 5
run "search gbs 16777216, 64 GPUs, 10 s" "2" "$bin" search --hostfile_path h64 --clusterfile_path "$CF" \
  --profile_data_path prof --num_layers 10 --gbs 16777216 --time-budget 10
run "--time-budget 0" "2" "$bin" search "${S[@]}" --gbs 64 --time-budget 0
run "--time-budget nan" "2" "$bin" search "${S[@]}" --gbs 64 --time-budget nan
run "--time-budget -1" "2" "$bin" search "${S[@]}" --gbs 64 --time-budget -1
run "--gpu-spec 10,000 entries" "0" "$bin" whatif --gpu-spec gpus10k.json --gpu G9999 --gpus 8 --rows DDP
run "--gpu-spec 60,000 entries" "0" "$bin" whatif --gpu-spec gpus60k.json --gpu G59999 --gpus 8 --rows DDP
mkdir -p escape/out/x escape/out/sub
printf '../../x slots=8\n0.0.0.4 slots=8\n' >escape/hostfile
cat >escape/cf.json <<'EOF'
{"../../x": {"instance_type": "A100", "inter_bandwidth": 25, "intra_bandwidth": 300, "memory": 80},
 "0.0.0.4": {"instance_type": "A100", "inter_bandwidth": 25, "intra_bandwidth": 300, "memory": 80}}
EOF
run "export torchrun, host ../../x" "0" "$bin" export --plan plan_a100.json --to torchrun --hostfile escape/hostfile \
  --clusterfile escape/cf.json --out escape/out/sub
check "  ... nothing written outside the folder" bash -c '! ls escape/*.sh escape/out/*.sh 2>/dev/null | grep -q .'
mkdir -p sym && echo precious >victim && ln -s "$W/victim" sym/megatron_args.sh
run "export through a symlink in --out" "0" "$bin" export --plan plan_a100.json --to megatron --out sym
check "  ... the symlink's target kept" grep -qx precious victim
mkdir -p wsym && echo precious >victim2 && ln -s "$W/victim2" wsym/plan.json && ln -s "$W" wsym/profiles
run "whatif --export through symlinks" "0 2" "$bin" whatif --gpu A100 --gpus 8 --rows DDP --export wsym
check "  ... the symlink's target kept" grep -qx precious victim2
run "whatif --seq 0" "2" "$bin" whatif --seq 0
run "--gpu-spec link over the network's limit" "2" "$bin" whatif --gpu-spec gpus_biglink.json --gpu FAST --gpus 8
run "gen-profiles --analytic past profile limits" "2" "$bin" gen-profiles --analytic 4096 65536 --types V100 \
  --hidden-size 65536 --heads 64 --max-tp 1 --out huge
run "a file of 16,777,567 bytes" "2" "$bin" simulate --plan big.json
run "layer_partition 5.0000001" "2" "$bin" simulate --plan plan_frac.json
run "a FIFO in place of a profile" "2" "$bin" search "${P[@]}" fifoprof --gbs 64
run "a directory in place of a profile" "2" "$bin" search "${P[@]}" dirprof --gbs 64

# --- more of our own ----------------------------------------------------------------------------
run "hostfile is a directory" "2" "$bin" search --hostfile_path adir --clusterfile_path "$CF" --profile_data_path prof --num_layers 10 --gbs 64
run "hostfile is a FIFO" "2" "$bin" search --hostfile_path fifo --clusterfile_path "$CF" --profile_data_path prof --num_layers 10 --gbs 64
run "hostfile is a symlink loop" "2" "$bin" search --hostfile_path selfloop --clusterfile_path "$CF" --profile_data_path prof --num_layers 10 --gbs 64
run "hostfile missing" "2" "$bin" search --hostfile_path nothere --clusterfile_path "$CF" --profile_data_path prof --num_layers 10 --gbs 64
run "clusterfile is a directory" "2" "$bin" search --hostfile_path "$H/a100_v100_16.hostfile" --clusterfile_path adir --profile_data_path prof --num_layers 10 --gbs 64
run "clusterfile is a FIFO" "2" "$bin" search --hostfile_path "$H/a100_v100_16.hostfile" --clusterfile_path fifo --profile_data_path prof --num_layers 10 --gbs 64
run "profile folder is a file" "2" "$bin" search "${P[@]}" afile --gbs 64
run "profile folder is empty" "2" "$bin" search "${P[@]}" adir --gbs 64
run "plan is a directory" "2" "$bin" simulate --plan adir
run "plan is a FIFO" "2" "$bin" simulate --plan fifo
run "plan is a symlink loop" "2" "$bin" simulate --plan selfloop
run "plan missing" "2" "$bin" simulate --plan nothere.json
run "search --json into a directory" "2" "$bin" search "${S[@]}" --gbs 64 --json adir
run "search --json under /proc" "2" "$bin" search "${S[@]}" --gbs 64 --json /proc/x/plan.json
run "simulate --trace into a directory" "2" "$bin" simulate --plan plan.json --trace adir
run "gen-hostfile --out a directory" "2" "$bin" gen-hostfile 16 --out adir
run "gen-hostfile --out under /proc" "2" "$bin" gen-hostfile 16 --out /proc/x/h
run "export --out under a file" "2" "$bin" export --plan plan.json --to megatron --out afile/sub
run "gen-profiles --out a file" "2" "$bin" gen-profiles --analytic 10 8 --types A100 --out afile
run "gen-profiles --samples a file" "2" "$bin" gen-profiles 10 8 --samples afile --out gp2
run "gen-profiles --samples missing" "2" "$bin" gen-profiles 10 8 --samples nothere --out gp3
run "--gpu-spec a directory" "2" "$bin" whatif --gpu-spec adir --gpus 8
run "--gpu-spec a FIFO" "2" "$bin" whatif --gpu-spec fifo --gpus 8
run "--gpu-spec missing" "2" "$bin" whatif --gpu-spec nothere --gpus 8
run "--hf-config a directory" "2" "$bin" whatif --hf-config adir
run "whatif --export into a file" "2" "$bin" whatif --gpu A100 --gpus 8 --rows DDP --export afile
run "whatif --export twice into one folder" "0" bash -c "'$bin' whatif --gpu A100 --gpus 8 --rows DDP --export wx && '$bin' whatif --gpu A100 --gpus 8 --rows DDP --export wx"
run "whatif exported plan from another cwd" "0" bash -c "cd / && '$bin' simulate --plan '$W/wx/plan.json'"
run "whatif --export profiles is a file" "2" bash -c "mkdir -p wf && echo x >wf/profiles && '$bin' whatif --gpu A100 --gpus 8 --rows DDP --export wf"
run "--time-budget inf" "2" "$bin" search "${S[@]}" --gbs 64 --time-budget inf
run "--time-budget 1e400" "2" "$bin" search "${S[@]}" --gbs 64 --time-budget 1e400
run "--time-budget empty" "0 2" "$bin" search "${S[@]}" --gbs 64 --time-budget ""
run "--time-budget none" "0" "$bin" search "${S[@]}" --gbs 64 --time-budget none
run "--time-budget 3" "0" "$bin" search "${S[@]}" --gbs 64 --time-budget 3
run "--time-budget 1x" "2" "$bin" search "${S[@]}" --gbs 64 --time-budget 1x
run "--gbs 0" "2" "$bin" search "${S[@]}" --gbs 0
run "--gbs 16777217" "2" "$bin" search "${S[@]}" --gbs 16777217
run "--num_layers 100000" "2" "$bin" search --hostfile_path "$H/a100_v100_16.hostfile" --clusterfile_path "$CF" --profile_data_path prof --num_layers 100000 --gbs 64
run "--threads 100000" "2" "$bin" search "${S[@]}" --gbs 64 --threads 100000
run "--top 0" "2" "$bin" search "${S[@]}" --gbs 64 --top 0
run "--top -5" "2" "$bin" search "${S[@]}" --gbs 64 --top -5
run "whatif --gpus 1000001" "0 2" "$bin" whatif --gpus 1000001 --gpu A100
run "whatif --gpus 0" "2" "$bin" whatif --gpus 0 --gpu A100
run "whatif --micro-batch 0" "2" "$bin" whatif --micro-batch 0
run "whatif --seq 1e400" "2" "$bin" whatif --seq 1e400
printf '\x00\x01\x02 slots=\xff\n' >junk_hostfile
run "hostfile of binary junk" "2" "$bin" search "${S[@]/$H\/a100_v100_16.hostfile/junk_hostfile}" --gbs 64
: >empty_hostfile
run "empty hostfile" "2" "$bin" search "${S[@]/$H\/a100_v100_16.hostfile/empty_hostfile}" --gbs 64
printf '0.0.0.4 slots=8\n' >h_odd
run "export torchrun, host with shell characters" "0" "$bin" export --plan plan_a100.json --to torchrun \
  --hostfile hq --clusterfile cq.json --out q
check "  ... nothing outside the folder, no command run" bash -c '! ls "$0"/*.sh "$0"/pwned* 2>/dev/null | grep -q .' "$W"

echo "$passed passed, $failed failed"
for f in "${failures[@]}"; do echo "FAILED: $f"; done
((failed == 0))
