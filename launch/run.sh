#!/usr/bin/env bash
# Single node: one torchrun, NPROC partitions (ranks) on this machine. Extra arguments go to geodml.
#
#   launch/run.sh --algo gaia --t0 0.1 --epochs 5          # 5 partitions, gloo on CPU
#   NPROC=16 launch/run.sh --steps 50 --wan virtual        # 16 partitions on one machine
#   launch/run.sh --dry-run --algo bsp                     # print the command, run nothing
#
# Environment (defaults in brackets):
#   NPROC [5]                 ranks (= data partitions) on this node
#   MASTER_ADDR [127.0.0.1]   rendezvous address; MASTER_PORT [29500]
#   OMP_NUM_THREADS [1]       threads per rank (2-thread ops collapse under contention)
#   PYTHON [.venv/bin/python, else python3]   interpreter with torch and geodml
#   TORCHRUN_ARGS []          extra torchrun flags, e.g. "--max-restarts 0"
# --backend auto (geodml's default) picks nccl when CUDA is present (rank i uses cuda:LOCAL_RANK,
# so NPROC must not exceed the GPUs of this node) and gloo otherwise. docs/launch.md has more.
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
NPROC=${NPROC:-5}
case "$NPROC" in ''|*[!0-9]*|0) echo "run.sh: NPROC must be a positive integer, got '$NPROC'" >&2; exit 2 ;; esac
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# shellcheck disable=SC2206  # TORCHRUN_ARGS is split on spaces on purpose
cmd=("$PYTHON" -m torch.distributed.run --nproc-per-node="$NPROC" --master-addr="${MASTER_ADDR:-127.0.0.1}"
     --master-port="${MASTER_PORT:-29500}" ${TORCHRUN_ARGS:-} -m geodml "$@")
if [ "$DRY_RUN" = 1 ]; then
  printf 'cd %q && OMP_NUM_THREADS=%s' "$ROOT" "$OMP_NUM_THREADS"; printf ' %q' "${cmd[@]}"; printf '\n'
  exit 0
fi
cd "$ROOT"
# A SIGINT/SIGTERM reaches torchrun, which passes it on to the ranks: they stop at an agreed step and
# rank 0 prints geodml's line (docs/reliability.md "Signals"); torchrun itself then prints its
# SignalException traceback and exits 1. Drop that traceback and exit as the ranks did (130/143).
exec "$ROOT/launch/torchrun-quiet.sh" "${cmd[@]}"   # drops torchrun's SignalException traceback (see there)
