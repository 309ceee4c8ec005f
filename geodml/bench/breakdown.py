"""Where a step's wall time goes, per phase and rank: ``python -m geodml.bench breakdown [--algo gaia] [-- geodml flags]``.

Runs ``torchrun -m geodml`` with K ranks (``--wan off``, no evaluation inside the run) with
timers wrapped around the phases of every step, then prints, per phase, the mean milliseconds
per step over the ranks (and the slowest rank):

* ``batch``: minibatch gather (``algo.work.batch_indices`` + index_select), ``fwd+bwd``: forward,
  loss and backward (what remains of ``train_step``);
* ``before_step`` / ``local_update`` / ``after_step``: the algorithm's hooks, with the
  selection kernel (Gaia / DGC ``select``) and the Comm calls inside them split out: ``send``
  (``send_to_all`` / ``send``), ``recv wait``
  (``recv_from_all`` / ``recv``: mostly waiting for the slowest peer in a lock-step exchange),
  ``collective`` (``all_reduce`` / ``broadcast`` / ``all_gather``);
* ``log``: the trainer's periodic logging (uncharged meta collectives).

It is a profile, not a benchmark: the timers cost ~1 us per call. The wrapping happens in the
worker process before geodml's CLI runs, so geodml itself is unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from geodml.bench.common import TIMEOUT_S, bench_env, format_table, torchrun_cmd, write_synthetic_cifar

_T: dict[str, float] = defaultdict(float)
_ACTIVE: set[str] = set()


def _wrap(cls, name: str, phase: str, unless: str = "") -> None:
    """Replace ``cls.name`` with a timed version adding its wall time to ``_T[phase]``; a call
    nested in one of the same phase (``super().hook()``, ``send_to_all`` -> ``send``) is not
    counted twice, nor one inside phase ``unless``."""
    import functools
    fn = cls.__dict__[name]

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        if phase in _ACTIVE or unless in _ACTIVE:
            return fn(*args, **kwargs)
        _ACTIVE.add(phase)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _T[phase] += time.perf_counter() - t0
            _ACTIVE.discard(phase)
    setattr(cls, name, timed)


def _worker(out_json: str, geodml_args: list[str]) -> int:
    from geodml import cli, trainer
    from geodml.algorithms import REGISTRY, algorithm_factory, base
    from geodml.comm.charged import ChargedComm  # defines the Comm methods of DistComm and InProcessComm

    for name in REGISTRY:
        algorithm_factory(name)  # import every algorithm module so its subclasses are wrapped

    for hook in ("before_step", "local_update", "after_step"):
        # wrap every Algorithm subclass's own definition of the hook
        seen = set()
        stack = [base.Algorithm]
        while stack:
            c = stack.pop()
            stack.extend(c.__subclasses__())
            if hook in c.__dict__ and (c, hook) not in seen:
                seen.add((c, hook))
                _wrap(c, hook, hook)
    for m, phase in (("send_to_all", "send"), ("send", "send"), ("recv_from_all", "recv wait"),
                     ("recv", "recv wait"), ("all_reduce", "collective"), ("broadcast", "collective"),
                     ("all_gather", "collective")):
        _wrap(ChargedComm, m, phase)
    from geodml.algorithms.gaia import Gaia
    from geodml.algorithms.topk import TopSelector
    if os.environ.get("GEODML_BENCH_GAIA_TORCH_SELECT") == "1":
        # the pre-NumPy selection (torch.nonzero), still what non-CPU devices run: for before/after
        init = Gaia.__init__

        def torch_select_init(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self._np = None
        Gaia.__init__ = torch_select_init
    _wrap(Gaia, "select", "selection")
    _wrap(TopSelector, "select", "selection")
    _wrap(trainer.Trainer, "train_step", "train_step")
    _wrap(trainer.Trainer, "_log", "log", unless="finish")
    _wrap(trainer.Trainer, "_finish", "finish")
    orig_run = trainer.Trainer.run

    def run(self):
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            return orig_run(self)
        finally:
            _T["run"] += time.perf_counter() - t0
            _T["cpu"] = time.process_time() - c0
            _T["steps"] = self.state.step
            with open(f"{out_json}.{self.rank}", "w") as fh:
                json.dump(dict(_T), fh)
    trainer.Trainer.run = run
    return cli.main(geodml_args)


def _phases(t: dict[str, float]) -> dict[str, float]:
    """Exclusive phase times (seconds) from the nested timers of one rank."""
    hooks = t.get("before_step", 0) + t.get("local_update", 0) + t.get("after_step", 0)
    comm = t.get("send", 0) + t.get("recv wait", 0) + t.get("collective", 0)
    # meta collectives of _log go through Comm.meta_*, which are not wrapped: log is exclusive
    return {
        "fwd+bwd+batch": t.get("train_step", 0) - hooks,
        "selection (gaia/dgc)": t.get("selection", 0),
        "other algorithm compute": hooks - comm - t.get("selection", 0),
        "send": t.get("send", 0),
        "recv wait": t.get("recv wait", 0),
        "collective": t.get("collective", 0),
        "periodic log": t.get("log", 0),
        "other (loop, skewscout)": t.get("run", 0) - t.get("train_step", 0) - t.get("log", 0) - t.get("finish", 0),
    }


def measure(algo: str, k: int, steps: int, model: str, extra: list[str],
            gaia_torch_select: bool = False) -> tuple[list[list], float, float]:
    with tempfile.TemporaryDirectory(prefix="geodml-bench-") as tmp:
        data = write_synthetic_cifar(Path(tmp) / "data", per_batch=1000, test_size=200)
        out_json = str(Path(tmp) / "t.json")
        args = ["--algo", algo, "--dataset", "cifar10", "--data-dir", str(data), "--model", model,
                "--batch-size", "20", "--wan", "off", "--no-progress", "--eval-every", str(10**9),
                "--log-every", "10", "--steps", str(steps), "--partition", "iid", "--out", str(Path(tmp) / "run"),
                *extra]
        cmd = torchrun_cmd(k, "-m", "geodml.bench.breakdown", "--worker", out_json, "--", *args)
        env = dict(bench_env(), GEODML_BENCH_GAIA_TORCH_SELECT="1" if gaia_torch_select else "0")
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        if r.returncode != 0:
            raise RuntimeError(f"breakdown run failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
        raw = [json.loads(Path(f"{out_json}.{i}").read_text()) for i in range(k)]
        per_rank = [_phases(t) for t in raw]
        cpu = sum(t["cpu"] for t in raw) / k / steps
    total = sum(sum(p.values()) for p in per_rank) / k
    rows = []
    for phase in per_rank[0]:
        vals = [p[phase] / steps * 1e3 for p in per_rank]
        rows.append([phase, sum(vals) / k, max(vals), sum(vals) / k / (total / steps * 1e3)])
    return rows, total / steps, cpu


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        rest = argv[2:]
        if rest[:1] == ["--"]:
            rest = rest[1:]
        return _worker(argv[1], rest)
    p = argparse.ArgumentParser(prog="python -m geodml.bench breakdown", description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", default="gaia")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--model", default="cnn")
    p.add_argument("--quick", action="store_true", help="40 steps")
    p.add_argument("--gaia-torch-select", action="store_true",
                   help="run Gaia's torch.nonzero selection (the pre-optimization path) for a before/after")
    p.add_argument("extra", nargs="*", help="extra geodml flags after --, e.g. -- --t0 0.01")
    a = p.parse_args(argv)
    steps = 40 if a.quick else a.steps
    rows, step_s, cpu_s = measure(a.algo, a.k, steps, a.model, a.extra, a.gaia_torch_select)
    print(format_table(["phase", "ms/step mean", "ms/step max rank", "share"], rows,
                       title=f"breakdown: {a.algo}, {a.model}, K={a.k}, {steps} steps, --wan off: "
                             f"{step_s * 1e3:.1f} ms/step wall, {cpu_s * 1e3:.1f} ms/step CPU per rank "
                             f"(means over ranks, whole run incl. warm-up; K x CPU / wall = "
                             f"{a.k * cpu_s / step_s:.2f} cores busy of 2)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
