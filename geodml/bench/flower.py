"""geodml's default command against Flower's simulation doing the same work: ``python -m geodml.bench
flower --flower-python PATH``.

For each client count K (default 5, 16, 100, 1,000; every client a round up to 16, else 10 clients
a round), one FedAvg run of ``--rounds`` rounds of Iter_Local 20 steps on Fashion-MNIST (digits
where it is not installed) with McMahan's CNN, side by side in one invocation:

* **geodml**: ``python -m geodml ...`` as a user types it (the default process count: one per core),
  and the same with ``--processes 1``, each timed as a whole command (start-up, training, the final
  evaluation, the run directory);
* **Flower**: the same run in Flower's simulation (geodml/bench/flower_app.py: one supernode per
  client, one CPU per client, so Ray trains as many clients at once as there are cores), run by
  ``--flower-python`` (a Python with ``flwr[simulation]``; geodml is put on its path), timed as a
  whole command too.

Both sides compute the same bits (flower_app's docstring says how): the benchmark checks that the
final global models are equal, tensor by tensor, and refuses a row where they are not. It prints
each row's seconds and the ratio Flower / geodml (above 1: geodml is faster), with the load
average; the machine is shared, so quote ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from geodml.bench.common import format_table

REPO = Path(__file__).resolve().parents[2]


def _dataset() -> str:
    from geodml.data.datasets import check_dataset_available
    try:
        check_dataset_available("fashion-mnist", None)
        return "fashion-mnist"
    except ValueError:
        return "digits"


def run_argv(k: int, rounds: int, dataset: str) -> list[str]:
    """The geodml flags of the run both sides make for K clients."""
    fraction = 1.0 if k <= 16 else 10 / k
    return ["--dataset", dataset, "--model", "cnn", "--partitions", str(k), "--algo", "fedavg", "--iter-local", "20",
            "--client-fraction", f"{fraction:g}", "--rounds", str(rounds), "--reset-momentum", "--eval-every",
            str(10**9), "--log-every", str(10**9), "--no-progress", "--wan", "off"]


def _timed(cmd: list[str], env: dict[str, str], timeout_s: float) -> float:
    t0 = time.monotonic()
    r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return time.monotonic() - t0


def _same_model(a: Path, b: Path) -> bool:
    import torch
    x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return list(x) == list(y) and all(torch.equal(x[n], y[n]) for n in x)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m geodml.bench flower", description=__doc__.split("\n\n")[0])
    p.add_argument("--flower-python", required=True, help="a Python interpreter with flwr[simulation] installed")
    p.add_argument("--ks", default="5,16,100,1000", help="client counts")
    p.add_argument("--rounds", type=int, default=20, help="FedAvg rounds per run")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per command")
    a = p.parse_args(argv)
    ks = [int(x) for x in a.ks.split(",") if x]
    dataset = _dataset()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_",
                                                                      "GEODML_PROCESSES"))}
    base["PYTHONPATH"] = str(REPO) + (os.pathsep + base["PYTHONPATH"] if base.get("PYTHONPATH") else "")
    base.setdefault("OMP_NUM_THREADS", "1")
    rows = []
    with tempfile.TemporaryDirectory(prefix="geodml-bench-flower-") as tmp:
        for k in ks:
            flags = run_argv(k, a.rounds, dataset)
            load = os.getloadavg()[0]
            out = {name: Path(tmp) / f"{name}-{k}" for name in ("geodml", "geodml1", "flower")}
            seconds = {
                "geodml": _timed([sys.executable, "-m", "geodml", *flags, "--out", str(out["geodml"])], base, a.timeout),
                "geodml1": _timed([sys.executable, "-m", "geodml", *flags, "--processes", "1", "--out",
                                   str(out["geodml1"])], base, a.timeout),
                "flower": _timed([a.flower_python, "-c", "import geodml.bench.flower_app as a; a.simulate()"],
                                 {**base, "GEODML_FLOWER_ARGV": json.dumps(flags), "GEODML_FLOWER_OUT": str(out["flower"])},
                                 a.timeout)}
            same = (_same_model(out["geodml"] / "model.pt", out["flower"] / "model.pt")
                    and _same_model(out["geodml1"] / "model.pt", out["flower"] / "model.pt"))
            if not same:
                raise RuntimeError(f"K = {k}: the final global models differ between geodml and Flower")
            processes = json.loads((out["geodml"] / "config.json").read_text())["processes"]
            acc = json.loads((out["geodml"] / "summary.json").read_text())["final_val_accuracy"]
            rows.append([k, flags[flags.index("--client-fraction") + 1], a.rounds, processes, seconds["geodml"],
                         seconds["geodml1"], seconds["flower"], seconds["flower"] / seconds["geodml"],
                         seconds["flower"] / seconds["geodml1"], acc, load])
            print(format_table(["K", "C", "rounds", "R", "geodml s", "geodml R=1 s", "Flower s", "Flower/geodml",
                                "Flower/geodml R=1", "accuracy", "load"], rows[-1:]), flush=True)
    print()
    print(format_table(["K", "C", "rounds", "R", "geodml s", "geodml R=1 s", "Flower s", "Flower/geodml",
                        "Flower/geodml R=1", "accuracy", "load"], rows,
                       title=f"FedAvg, Iter_Local 20, --reset-momentum, cnn on {dataset}, whole commands; the final "
                             "global models equal on both sides (checked); targets: Flower/geodml >= 1.5 at K = 100 "
                             "and 1,000, >= 3 at K <= 16"))
    return 0
