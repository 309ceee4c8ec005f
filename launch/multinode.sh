#!/usr/bin/env bash
# Multi-node: run this once on every node (same flags everywhere); torchrun's c10d rendezvous
# at RDZV_HOST:RDZV_PORT joins them into one job of NNODES x NPROC ranks. Extra arguments go to geodml.
#
#   # on node A (10.0.0.1) and on node B, the same line except NODE_RANK:
#   NNODES=2 NODE_RANK=0 NPROC=4 RDZV_HOST=10.0.0.1 launch/multinode.sh --algo gaia --out /shared/runs/x
#   NNODES=2 NODE_RANK=1 NPROC=4 RDZV_HOST=10.0.0.1 launch/multinode.sh --algo gaia --out /shared/runs/x
#   launch/multinode.sh --dry-run ...     # print the torchrun command, run nothing
#
# Environment (defaults in brackets):
#   NNODES [1]                nodes in the job
#   NODE_RANK [$SLURM_NODEID, else 0]   this node's index (informational for c10d, see below)
#   NPROC [5]                 ranks on this node (GPU hosts: one per GPU)
#   RDZV_HOST [$MASTER_ADDR, else 127.0.0.1]  rendezvous host (the first node); RDZV_PORT [29500]
#   RDZV_ID [geodml]          job id shared by the nodes (use a new one per job on a shared host)
#   RDZV_BACKEND [c10d]       c10d (elastic; global ranks are assigned by the rendezvous, in sorted
#                             order of node descriptors, so NODE_RANK does not order ranks) or
#                             static (node NODE_RANK holds ranks NODE_RANK*NPROC .. +NPROC-1;
#                             use it when a region must sit on a given host)
#   OMP_NUM_THREADS [1], PYTHON [.venv/bin/python, else python3], TORCHRUN_ARGS []
# Addressing: each rank binds ZeroMQ on the interface that routes to the rendezvous host (or
# --bind-host); give --metrics-host 0.0.0.0 so a Prometheus server on another host can scrape
# every node's exporters (ports --metrics-port + local rank on each node). docs/launch.md.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DRY_RUN=0
case "${1:-}" in
  -h|--help) sed -n '2,/^set -e/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  --dry-run) DRY_RUN=1; shift ;;
esac
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-${SLURM_NODEID:-0}}
NPROC=${NPROC:-5}
RDZV_HOST=${RDZV_HOST:-${MASTER_ADDR:-127.0.0.1}}
RDZV_PORT=${RDZV_PORT:-29500}
RDZV_BACKEND=${RDZV_BACKEND:-c10d}
for v in NNODES NPROC RDZV_PORT; do
  case "${!v}" in ''|*[!0-9]*|0) echo "multinode.sh: $v must be a positive integer, got '${!v}'" >&2; exit 2 ;; esac
done
case "$NODE_RANK" in ''|*[!0-9]*) echo "multinode.sh: NODE_RANK must be an integer >= 0, got '$NODE_RANK'" >&2; exit 2 ;; esac
if [ "$NODE_RANK" -ge "$NNODES" ]; then
  echo "multinode.sh: NODE_RANK=$NODE_RANK but NNODES=$NNODES (node ranks are 0..$((NNODES - 1)))" >&2; exit 2
fi
case "$RDZV_BACKEND" in
  c10d) rdzv=(--rdzv-backend=c10d --rdzv-endpoint="$RDZV_HOST:$RDZV_PORT" --rdzv-id="${RDZV_ID:-geodml}") ;;
  static) rdzv=(--master-addr="$RDZV_HOST" --master-port="$RDZV_PORT") ;;
  *) echo "multinode.sh: RDZV_BACKEND must be c10d or static, got '$RDZV_BACKEND'" >&2; exit 2 ;;
esac
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# shellcheck disable=SC2206  # TORCHRUN_ARGS is split on spaces on purpose
cmd=("$PYTHON" -m torch.distributed.run --nnodes="$NNODES" --node-rank="$NODE_RANK" --nproc-per-node="$NPROC"
     "${rdzv[@]}" ${TORCHRUN_ARGS:-} -m geodml "$@")
if [ "$DRY_RUN" = 1 ]; then
  printf 'cd %q && OMP_NUM_THREADS=%s' "$ROOT" "$OMP_NUM_THREADS"; printf ' %q' "${cmd[@]}"; printf '\n'
  exit 0
fi
cd "$ROOT"
exec "$ROOT/launch/torchrun-quiet.sh" "${cmd[@]}"   # drops torchrun's SignalException traceback (see there)
