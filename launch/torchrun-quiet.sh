#!/usr/bin/env bash
# Run a torchrun command line ("$@") and report a signal the way the geodml ranks did (launch/run.sh and
# launch/multinode.sh, and so launch/slurm.sbatch, exec it). torchrun's own launcher answers SIGINT/SIGTERM/SIGUSR1 with
# a SignalException traceback and exit 1, which geodml cannot change; this drops that traceback (every other
# line of stderr passes through, a non-signal traceback included) and exits as the ranks did: 130 (SIGINT),
# 143 (SIGTERM), 138 (SIGUSR1) once a rank printed "geodml: interrupted (SIG...)", else torchrun's own status.
# The signal itself still reaches torchrun (the terminal's group, SLURM, kill), which passes it to the ranks;
# this script only waits for them.
set -euo pipefail
said=$(mktemp); trap 'rm -f "$said"' EXIT
trap 'true' INT TERM USR1   # wait for torchrun and the ranks to finish what the signal started
set +e
"$@" 2> >(trap '' INT TERM USR1; exec awk -v said="$said" '
  /^geodml: interrupted \(SIG[A-Z0-9]+\)/ { match($0, /SIG[A-Z0-9]+/); print substr($0, RSTART, RLENGTH) > said; close(said) }
  /^Traceback \(most recent call last\):/ { held = $0; holding = 1; next }
  holding { held = held "\n" $0
            if ($0 ~ /SignalException: Process [0-9]+ got signal/) { holding = 0; held = ""; next }
            if ($0 !~ /^[ \t]/ && $0 !~ /^Traceback/) { print held; holding = 0; held = "" }
            next }
  { print }
  END { if (holding) print held }' >&2)
status=$?
until wait; do :; done   # the filter too (`wait` returns early, > 128, when a trapped signal arrives)
set -e
case "$(cat "$said" 2>/dev/null)" in
  SIGINT) exit 130 ;;
  SIGTERM) exit 143 ;;
  SIGUSR1) exit 138 ;;
esac
exit "$status"
