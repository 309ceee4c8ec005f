"""Measure a K-partition run on this machine: memory and per-rank start-up (docs/launch.md).

    .venv/bin/python launch/scale_probe.py --nproc 32 --out /tmp/k32 -- --steps 20 --wan virtual

Runs ``torchrun --nproc_per_node=K -m geodml ARGS --out OUT`` and samples, every
``--interval`` seconds, the resident memory of the whole process tree with psutil: the sum of
RSS (counts shared pages -- torch's libraries, a shared dataset cache -- once per rank) and the
sum of PSS (each shared page divided among the processes that map it: the honest total).
Per rank it reads ``OUT/rank<k>/startup.json`` (written by geodml.compose: imports, process group,
ZeroMQ mesh, data, model set-up, peak RSS from getrusage). Prints a table and writes
``OUT/scale_probe.json``. Bounded: the job is killed after ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
PHASES = ("imports_s", "process_group_s", "zmq_mesh_s", "data_s", "model_s", "total_s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tree_memory(root: psutil.Process, with_pss: bool) -> tuple[int, int, int, dict[int, int]]:
    """(sum RSS, sum PSS, process count, {pid: rss}) of root's descendants (the ranks and torchrun)."""
    rss = pss = n = 0
    per: dict[int, int] = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            if with_pss:
                m = p.memory_full_info()
                pss += m.pss
            else:
                m = p.memory_info()
            rss += m.rss
            per[p.pid] = m.rss
            n += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return rss, pss, n, per


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, required=True, help="ranks (partitions) on this machine")
    ap.add_argument("--out", required=True, help="run directory (must not hold a finished run)")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between memory samples")
    ap.add_argument("--timeout", type=float, default=600.0, help="kill the job after this many seconds")
    ap.add_argument("--no-pss", action="store_true", help="sample RSS only (PSS reads smaps: costlier)")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then geodml flags")
    a = ap.parse_args()
    extra = a.args[1:] if a.args[:1] == ["--"] else a.args
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={a.nproc}", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", "-m", "geodml", "--no-progress", *extra, "--out", a.out]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    root = psutil.Process(proc.pid)
    peak_rss = peak_pss = 0
    peak_rank_rss: dict[int, int] = {}
    try:
        while proc.poll() is None:
            if time.monotonic() - t0 > a.timeout:
                raise TimeoutError(f"job ran past --timeout {a.timeout:g} s")
            rss, pss, _, per = _tree_memory(root, not a.no_pss)
            peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
            for pid, r in per.items():
                peak_rank_rss[pid] = max(peak_rank_rss.get(pid, 0), r)
            time.sleep(a.interval)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate()[0]
    wall_s = time.monotonic() - t0
    if proc.returncode != 0:
        log = Path(a.out + ".log")
        log.write_text(output)
        print(output[-4000:] + f"\nscale_probe: the job failed; its whole output is in {log}", file=sys.stderr)
        return proc.returncode or 1
    out = Path(a.out)
    ranks = [json.loads((out / f"rank{r}" / "startup.json").read_text()) for r in range(a.nproc)]
    result = {
        "nproc": a.nproc, "argv": extra, "wall_s": round(wall_s, 2),
        "run_peak_rss_sum_bytes": peak_rss, "run_peak_pss_sum_bytes": peak_pss if not a.no_pss else None,
        "rank_peak_rss_bytes": {"max": max(r["peak_rss_bytes"] for r in ranks),
                                "median": int(statistics.median(r["peak_rss_bytes"] for r in ranks))},
        "startup_s": {ph: {"median": round(statistics.median(r[ph] for r in ranks), 3),
                           "max": round(max(r[ph] for r in ranks), 3)} for ph in PHASES},
        "ranks": ranks,
    }
    (out / "scale_probe.json").write_text(json.dumps(result, indent=2) + "\n")
    mib = 1 / 2**20
    print(f"K={a.nproc}: wall {wall_s:.1f} s; whole run peak RSS sum {peak_rss * mib:.0f} MiB"
          + (f", PSS sum {peak_pss * mib:.0f} MiB" if not a.no_pss else "")
          + f"; per rank peak RSS median {result['rank_peak_rss_bytes']['median'] * mib:.0f} MiB, "
            f"max {result['rank_peak_rss_bytes']['max'] * mib:.0f} MiB")
    print("start-up per rank (s):  " + "  ".join(f"{ph[:-2]} {v['median']:.2f}/{v['max']:.2f}"
                                               for ph, v in result["startup_s"].items()) + "   (median/max)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
