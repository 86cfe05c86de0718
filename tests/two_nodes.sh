#!/usr/bin/env bash
# Runs the scripts of `hetplan export --to torchrun` for a two-host plan as
# two "nodes" on this machine (two launcher processes on localhost), with
# tests/fake_torchrun.sh standing in for torchrun where PyTorch's Python
# package is absent (TORCHRUN, if set, wins). HETPLAN names the binary.
#
#   two_nodes.sh train DIR   both nodes; exit 0 iff both end with 0
#   two_nodes.sh kill DIR    node 1 is killed (SIGKILL to its launcher and ranks)
#                            KILL_AFTER_S seconds in; prints node 0's exit code
#                            and how long it took to end after the kill
#   two_nodes.sh absent DIR  node 1 never starts; prints node 0's exit code and time
# Logs: DIR/node0.log, DIR/node1.log.
set -uo pipefail
mode=$1 dir=$2
here=$(cd "$(dirname "$0")" && pwd)
export TORCHRUN=${TORCHRUN:-$here/fake_torchrun.sh}
s0=$(ls "$dir"/launch_0_*.sh) s1=$(ls "$dir"/launch_1_*.sh)
now() { date +%s.%N; }
case "$mode" in
  train)
    bash "$s0" >"$dir/node0.log" 2>&1 & p0=$!
    bash "$s1" >"$dir/node1.log" 2>&1 & p1=$!
    wait $p0; r0=$?
    wait $p1; r1=$?
    echo "node0_exit=$r0 node1_exit=$r1"
    echo "--- node0.log"; cat "$dir/node0.log"; echo "--- node1.log"; cat "$dir/node1.log"
    [ $r0 -eq 0 ] && [ $r1 -eq 0 ] ;;
  kill)
    # Node 1 in its own session, so that one signal reaches its launcher and ranks.
    setsid bash "$s1" >"$dir/node1.log" 2>&1 & p1=$!
    bash "$s0" >"$dir/node0.log" 2>&1 & p0=$!
    sleep "${KILL_AFTER_S:-8}"
    kill -9 -- "-$p1"
    t=$(now)
    wait $p0; r0=$?
    echo "node0_exit=$r0 seconds_after_kill=$(awk "BEGIN { print $(now) - $t }")"
    echo "--- node0.log"; cat "$dir/node0.log" ;;
  absent)
    t=$(now)
    bash "$s0" >"$dir/node0.log" 2>&1; r0=$?
    echo "node0_exit=$r0 seconds=$(awk "BEGIN { print $(now) - $t }")"
    echo "--- node0.log"; cat "$dir/node0.log" ;;
  *) echo "two_nodes.sh: mode train, kill or absent" >&2; exit 2 ;;
esac
