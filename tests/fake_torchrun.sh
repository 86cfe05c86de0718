#!/usr/bin/env bash
# A stand-in for torchrun where PyTorch's Python package is not installed
# (this CPU test machine): it takes the flags that the scripts of
# `hetplan export --to torchrun` pass, and starts --nproc-per-node copies of
# the command with the environment torchrun's agent gives its workers
# (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK,
# MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT). Like a static
# rendezvous: node N's workers take global ranks N * nproc .. (every node
# runs the same nproc), MASTER_ADDR:MASTER_PORT is the rendezvous endpoint
# and global rank 0 serves the store there (no agent store). Like torchrun,
# when a worker fails the others are stopped and it exits 1.
set -uo pipefail
nnodes=1 node_rank=0 nproc=1 endpoint=127.0.0.1:29500
while [ $# -gt 0 ]; do
  case "$1" in
    --nnodes) nnodes=$2; shift 2 ;;
    --node-rank|--node_rank) node_rank=$2; shift 2 ;;
    --nproc-per-node|--nproc_per_node) nproc=$2; shift 2 ;;
    --rdzv-endpoint|--rdzv_endpoint) endpoint=$2; shift 2 ;;
    --rdzv-backend|--rdzv_backend|--rdzv-id|--rdzv_id|--max-restarts|--max_restarts) shift 2 ;;
    --no-python|--no_python) shift ;;
    --) shift; break ;;
    -*) echo "fake_torchrun: unknown flag $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
pids=()
for ((i = 0; i < nproc; i++)); do
  RANK=$((node_rank * nproc + i)) WORLD_SIZE=$((nnodes * nproc)) LOCAL_RANK=$i LOCAL_WORLD_SIZE=$nproc \
    GROUP_RANK=$node_rank NODE_RANK=$node_rank MASTER_ADDR=${endpoint%:*} MASTER_PORT=${endpoint##*:} \
    TORCHELASTIC_RESTART_COUNT=0 "$@" &
  pids+=($!)
done
trap 'kill -9 "${pids[@]}" 2>/dev/null; exit 143' TERM INT
status=0
for ((left = nproc; left > 0; left--)); do
  wait -n
  rc=$?
  if [ $rc -ne 0 ] && [ $status -eq 0 ]; then
    # Like torchrun's report of a failed worker (128 + N: killed by signal N).
    echo "fake_torchrun: a worker exited with code $rc; stopping the others" >&2
    status=1
    kill -TERM "${pids[@]}" 2>/dev/null
  fi
done
exit $status
