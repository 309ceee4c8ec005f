#!/usr/bin/env bash
# The README's first command: bootstrap, then a 5-partition run on the embedded digits data.
# Extra arguments are passed to geodml (e.g. launch/demo.sh --partition label --skew 1.0).
# NPROC overrides the number of partitions (default 5).
set -euo pipefail
cd "$(dirname "$0")/.."
launch/bootstrap.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/torchrun --nproc_per_node="${NPROC:-5}" --master_addr=127.0.0.1 --master_port="${MASTER_PORT:-29517}" \
  -m geodml --algo gaia --t0 0.1 --dataset digits --partition iid --epochs 20 --eval-every 100 "$@"
