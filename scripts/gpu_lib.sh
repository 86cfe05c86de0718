# Shared by the device scripts (scripts/gpu_*.sh): source it from the repo root, after
# `cd "$(dirname "$0")/.."`; it defines functions only and runs nothing.
#
#   gpu_machine                  one line naming the machine, as the run's records quote it:
#                                "<DEVICE_KIND or 'GPU machine'>: <count> <GPU name>, <memory>, <driver>[;...];
#                                 torch <version> cuda <version>; <n> CPU cores"
#                                (GPUs of one kind grouped by nvidia-smi, torch as python3 imports it)
#   gpu_step_limit LIMIT_S BUDGET_S T0
#                                LIMIT_S, or what is left of BUDGET_S seconds counted from $SECONDS = T0 where
#                                that is less (it may be 0 or negative: the caller decides to skip the step)
#   gpu_timed LIMIT_S LOG CMD... runs CMD with its output (stdout and stderr) in LOG, killed LIMIT_S seconds
#                                after it starts (and with SIGKILL 10 s later); returns CMD's exit status
#                                (124 or 137 when killed)
#
# Each script keeps its own step wrapper (what it prints before and after a step, and when it skips one):
# those messages are what its logs and the lead's notes quote.

gpu_machine() {
  local gpus torchv
  gpus=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sort | uniq -c |
    sed 's/^ *//' | paste -sd';')
  torchv=$(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')
  echo "${DEVICE_KIND:-GPU machine}: ${gpus}; torch ${torchv}; $(nproc) CPU cores"
}

gpu_step_limit() {
  local limit=$1 left=$(($2 - (SECONDS - $3)))
  if [ "$left" -lt "$limit" ]; then echo "$left"; else echo "$limit"; fi
}

gpu_timed() {
  local limit=$1 log=$2
  shift 2
  timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
}

# gpu_local_hostfile TYPE FILE: a one-node hostfile of this machine's GPUs, at the address that
# hostfiles/clusterfile.json gives TYPE (e.g. H100 -> 0.0.0.5, H200 -> 0.0.0.6).
gpu_local_hostfile() {
  local addr slots
  addr=$(python3 -c "import json, sys; c = json.load(open('hostfiles/clusterfile.json')); \
print(next(a for a, v in c.items() if v['instance_type'] == sys.argv[1]))" "$1") || return 1
  slots=$(nvidia-smi -L 2>/dev/null | wc -l); [[ $slots -ge 1 ]] || slots=2
  printf '# One node of %s %s GPUs.\n%s slots=%s\n' "$slots" "$1" "$addr" "$slots" > "$2"
}

# gpu_localize_plan SRC DST DROP_CP GPU HOSTFILE: SRC's plan on this machine's GPUs (every stage's type GPU,
# the hostfile HOSTFILE); DROP_CP=1 also removes context_parallel (the plan's dp twin); DROP_CP=sp removes
# sequence_parallel instead (the plan's twin with the tp all-reduces).
gpu_localize_plan() {
  python3 - "$@" <<'PY'
import json, sys
src, dst, drop_cp, gpu, host = sys.argv[1:6]
p = json.load(open(src))
p["node_sequence"] = [gpu for _ in p["node_sequence"]]
p["hostfile"] = host
if drop_cp == "1":
    p.pop("context_parallel", None)
elif drop_cp == "sp":
    p.pop("sequence_parallel", None)
json.dump(p, open(dst, "w"), indent=1)
PY
}
