#!/usr/bin/env bash
# Launch an N-process jaxformer training run on this machine, each process with D simulated CPU devices,
# talking over loopback (JAX's multi-controller runtime; CPU collectives over gloo). Process 0 logs.
#
#   sharding/launch_local.sh N D [train.py arguments ...]
#   sharding/launch_local.sh 2 2 train.steps=50 mesh.data=4 run.dir=runs/two_processes
set -euo pipefail
cd "$(dirname "$0")/.."
processes=${1:?number of processes}; devices=${2:?devices per process}; shift 2
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for ((id = 0; id < processes; id++)); do
  XLA_FLAGS="--xla_force_host_platform_device_count=${devices}" python3 train.py "$@" \
    mesh.coordinator="127.0.0.1:${port}" mesh.num_processes="${processes}" mesh.process_id="${id}" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit "$status"
