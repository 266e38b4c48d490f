#!/usr/bin/env bash
# Starts N ranks of a command on this machine with torchrun's environment
# (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), as
# `torchrun --nproc-per-node N --no-python CMD...` would. Debian's own torchrun
# cannot: bookworm's (1.13) fails under Python 3.11 in its redirects parsing,
# trixie's (2.6) asks its TCPStore for libuv, which Debian's build lacks.
# If a rank fails, the others are stopped (their run files stay readable).
# Exit status: the first non-zero exit of a rank, else 0.
# Usage: scripts/launch.sh N CMD [ARGS...]     (env MASTER_PORT to pick the port)
set -uo pipefail
if [ $# -lt 2 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 N CMD [ARGS...]   (N ranks of CMD on 127.0.0.1)" >&2
  exit 2
fi
n=$1; shift
port=${MASTER_PORT:-$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
# Each rank leads its own process group (setsid execs in place: $! is the
# rank), so stopping a rank stops whatever it started too.
pids=()
for rank in $(seq 0 $((n - 1))); do
  RANK=$rank WORLD_SIZE=$n LOCAL_RANK=$rank MASTER_ADDR=127.0.0.1 MASTER_PORT=$port setsid "$@" &
  pids+=($!)
done
trap 'for p in "${pids[@]}"; do kill -INT -- "-$p" 2>/dev/null; done' INT
status=0
running=("${pids[@]}")
while [ ${#running[@]} -gt 0 ]; do
  done_pid=""
  wait -n -p done_pid "${running[@]}"; code=$?
  [ -z "${done_pid:-}" ] && break
  still=(); for p in "${running[@]}"; do [ "$p" != "$done_pid" ] && still+=("$p"); done
  running=("${still[@]}")
  if [ $code -ne 0 ]; then
    status=$code
    echo "launch: a rank exited with $code; stopping the others" >&2
    # The group for what a rank started; the pid too, for a rank so new it
    # has not made its group yet.
    for p in "${running[@]}"; do kill -TERM -- "-$p" "$p" 2>/dev/null; done
    wait 2>/dev/null
    break
  fi
done
exit $status
