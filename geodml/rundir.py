"""The run-directory contract (docs/design.md "The run directory contract"): file names, the
config.json header, the summary, atomic writers, and reading a run back.

Tests, ``geodml.report`` and the study runner read run directories through this module, so the
names live here once:

* ``config.json``      the resolved RunConfig, package version, topology, host (``write_header``)
* ``partitions.json``  per-partition label counts and entropies
* ``metrics.jsonl``    one JSON object a line, rank 0 (``geodml.metrics.sinks.JsonlSink``)
* ``summary.json``     written last, atomically: its presence means "finished" (``read_summary``)
* ``model.pt``         the global model's state_dict; ``rank<k>/model.pt`` each partition's own
* ``rank<k>/``         per-rank state: ``startup.json``, checkpoints ``ckpt-<step>.pt``
* ``prometheus_targets.json``  the Prometheus file_sd targets (with ``--metrics-port``)

It imports torch only where a writer needs it, so readers (reports, the study runner) stay light.
Every writer is atomic (a temporary file, then ``os.replace``): a crash leaves the old file or
the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geodml.errors import storage_error

if TYPE_CHECKING:
    from geodml.algorithms.base import Algorithm
    from geodml.config import RunConfig

CONFIG = "config.json"
PARTITIONS = "partitions.json"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
MODEL = "model.pt"
STARTUP = "startup.json"
PROMETHEUS_TARGETS = "prometheus_targets.json"


def rank_dir(out: Path | str, rank: int) -> Path:
    """``<out>/rank<k>``: the directory of one rank's own files."""
    return Path(out) / f"rank{rank}"


# ---- atomic writers ------------------------------------------------------------------------
def _atomic(path: Path, what: str, write: Any) -> None:
    """``write(file)`` into ``path.tmp``, then rename it over ``path``; a failed write removes the temp file,
    leaves ``path`` as it was, and raises StorageError."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise storage_error(path, what, exc) from None


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON atomically (temp file + rename); StorageError when it cannot be written."""
    data = (json.dumps(obj, indent=2, default=str) + "\n").encode()
    _atomic(Path(path), Path(path).name, lambda f: f.write(data))


def save_torch(path: Path, obj: Any, *, fsync: bool = False, what: str = "model file") -> None:
    """``torch.save`` atomically; ``fsync`` also forces the bytes to disk before the rename
    (checkpoints: a crash right after must still find a complete file). StorageError when it cannot be
    written (RuntimeError from torch's writer on a short write, too)."""
    import torch  # here, not at the top: reports and the study runner read run directories without torch

    def write(f: Any) -> None:
        try:
            torch.save(obj, f)
        except RuntimeError as exc:   # torch's zip writer reports a failed write as "unexpected pos ..."
            if isinstance(exc.__context__, OSError):
                raise exc.__context__ from None
            raise OSError(0, f"write failed ({str(exc).splitlines()[0][:120]})") from None
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    _atomic(Path(path), what, write)


# ---- reading back --------------------------------------------------------------------------
def read_json(path: Path) -> Any | None:
    """The parsed JSON file, or None when it does not exist (``json.JSONDecodeError`` propagates)."""
    if not path.exists():
        return None
    return json.loads(path.read_text())


def read_summary(out: Path | str) -> dict | None:
    """The run's summary.json, or None when absent or unreadable (a run killed mid-write)."""
    try:
        doc = json.loads((Path(out) / SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def is_finished(out: Path | str) -> bool:
    """A run directory is finished when it holds summary.json (written last)."""
    return (Path(out) / SUMMARY).exists()


# ---- what a run writes ---------------------------------------------------------------------
def host_info() -> dict:
    """What a run's floating-point results depend on beyond the code and flags. Runs are
    bit-reproducible for the same commit, flags and host, but torch picks its CPU kernels by
    instruction set (AVX2 vs AVX-512 round differently), so two machines can differ in the last
    bits and, over a long run, in the accuracy (REPRODUCTION.md, determinism note)."""
    import numpy as np
    import torch

    from geodml import kernels
    return {"torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cuda": torch.version.cuda, "selection_kernels": kernels.describe()}


def write_header(out: Path, *, config_doc: Mapping[str, Any], partitions: Mapping[str, Any]) -> None:
    """config.json (with the host added) and partitions.json; rank 0, before training."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / CONFIG, {**config_doc, "host": host_info()})
    write_json(out / PARTITIONS, partitions)


class RunFinished(Exception):
    """``--out`` holds a finished run and this process is a torchrun restart: nothing to do (exit 0)."""


def _creatable(p: Path) -> str | None:
    """Why ``p`` (a directory to be) cannot be written, or None. Probes the nearest existing
    directory with a temporary file, which it removes again (nothing written stays)."""
    import tempfile

    probe = p
    while not probe.exists():
        if probe.parent == probe:
            return "none of its parents exists"
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is a file, not a directory"
    try:
        fd, name = tempfile.mkstemp(prefix=".geodml-probe-", dir=probe)
    except OSError as exc:
        return f"{probe} is not writable ({exc.strerror or exc})"
    os.close(fd)
    os.unlink(name)
    return None


def check_out_dir(out: Path | str | None, *, restarting: bool = False) -> None:
    """``--out`` checks that need no process group (ValueError naming the flag): it must be a
    directory that can be created and written (a path through a file, a read-only file system or
    directory are refused before anything starts); a finished run (summary.json) is refused --
    except on a torchrun restart, which raises :class:`RunFinished`: the job's outputs are
    complete and a restart must not fail it."""
    if out is None:
        return
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise ValueError(f"--out {p} exists and is not a directory")
    why = _creatable(p)
    if why is not None:
        raise ValueError(f"--out {p} cannot be written: {why}; choose another --out")
    if is_finished(p):
        if restarting:
            raise RunFinished(str(p))
        raise ValueError(f"--out {p} already holds a finished run (summary.json); choose another --out or remove it")


def check_not_crashed(out: Path | str | None, *, resume: bool) -> None:
    """An unfinished run without checkpoints (a crash before the first checkpoint leaves
    config.json and metrics.jsonl) is refused unless ``resume``: --restart (or --resume, which
    finds nothing to resume) starts it afresh in place and rewrites metrics.jsonl; a run never
    appends to a crashed run's metrics."""
    if out is None or resume:
        return
    p = Path(out)
    left = [name for name in (CONFIG, METRICS) if (p / name).exists()]
    if left and not any(p.glob("rank*/ckpt-*.pt")):
        raise ValueError(f"--out {p} holds an unfinished run ({' and '.join(left)}; no summary.json and no checkpoint to "
                         "resume from): start it again there with --restart, or choose another --out")


def make_summary(cfg: RunConfig, *, world_size: int, result: Mapping[str, Any], totals: Mapping[str, Any], emulated_s: float,
                 wall_s: float, steps: int, steps_per_epoch: int, bsp_bytes: int, algo: Algorithm,
                 skewscout: Mapping[str, Any]) -> dict[str, Any]:
    """summary.json: the run's final numbers (docs/design.md lists the keys tests and tools rely on).

    ``result`` is ``Trainer.run()``'s, ``totals`` ``Ledger.summarize`` of every rank's rows,
    ``bsp_bytes`` the WAN bytes BSP would have sent over the same steps on the same placement (one
    gradient all-reduce per step under the ring cost model: what a BSP run's ledger records,
    tests/test_bsp.py), ``skewscout`` SkewScout's own summary (empty without it)."""
    final = result["final"]
    total_bytes = totals["wan_bytes_total"]
    final_model = "global" if algo.models_agree or algo.global_model_rank is not None else "average_of_weights"
    per = result["per_rank_val_accuracy"]
    own_mean = sum(per) / len(per) if per else None
    own_leads = final_model == "average_of_weights" and own_mean is not None
    return {
        "algo": cfg.algo.algo,
        # the algorithm as built: --algo fedavg with --prox-mu and --server-momentum is "fedprox+fedavgm"
        "algo_variant": algo.name,
        "final_val_accuracy": final["val_accuracy"],
        "final_model": final_model,
        # the one number to quote (docs/run-directory.md "Which accuracy"): where partitions end with models of their
        # own, the mean of their own models' accuracies (the Quagmire paper's measure); else the global model's
        "headline_val_accuracy": own_mean if own_leads else final["val_accuracy"],
        "headline_measure": "partition_mean" if own_leads else final_model,
        "partition_mean_val_accuracy": own_mean,
        "per_rank_val_accuracy": per,
        "per_rank_train_accuracy": result["per_rank_train_accuracy"],
        "per_rank_val_examples": cfg.partition_eval_examples,  # null: the whole test set
        "final_val_loss": final["val_loss"],
        "final_train_loss": final["train_loss"],
        **totals,
        "emulated_seconds": emulated_s,
        "wall_seconds": wall_s,
        "steps": steps,
        "epochs": steps / steps_per_epoch,
        # --divergence-loss: the step after which the mean training loss was NaN, inf or above it (null: ran to the end)
        "diverged_at_step": result.get("diverged_at_step"),
        "bsp_equivalent_wan_bytes": bsp_bytes,
        "wan_savings_vs_bsp": (bsp_bytes / total_bytes) if total_bytes else None,
        "theta_final": algo.knob.get() if algo.knob is not None else None,
        "theta_name": algo.knob.name if algo.knob is not None else None,
        **skewscout,
        "world_size": world_size,
        "dataset": cfg.data.dataset,
        "partition": cfg.data.partition,
        "skew": cfg.data.skew if cfg.data.partition == "label" else None,
        "model": f"{cfg.model.model}/{cfg.model.norm}",
    }


def _vs_bsp_line(summary: Mapping[str, Any]) -> str:
    """One line comparing the run's WAN bytes with BSP's over the same steps ('' for BSP itself)."""
    from geodml.metrics.sinks import human_bytes
    if summary["algo"] == "bsp" or summary["world_size"] < 2:
        return ""
    bsp, savings = summary["bsp_equivalent_wan_bytes"], summary["wan_savings_vs_bsp"]
    if not bsp:
        return ""  # every rank in one region: BSP would send nothing over the WAN either
    ratio = "no WAN bytes at all" if savings is None else f"{savings:.1f}x fewer WAN bytes than BSP"
    return (f"vs BSP: BSP sends {human_bytes(bsp)} ({bsp:,} B) in the same {summary['steps']} steps (one ring "
            f"all-reduce of the gradients per step, computed) -> {ratio}\n")


def done_text(summary: Mapping[str, Any], out: Path) -> str:
    """The lines rank 0 prints when the run has finished."""
    from geodml.metrics.sinks import human_bytes
    per = summary["per_rank_val_accuracy"]
    if per is None:  # --partition-scores auto: every partition holds a copy of a global model
        shown = "partitions hold global models; --partition-scores all scores each"
    elif len(per) <= 16:
        shown = f"per partition {', '.join(f'{a:.3f}' for a in per)}"
    else:  # summary.json has every partition's
        ordered = sorted(per)
        shown = (f"per partition min {ordered[0]:.3f}, median {ordered[len(ordered) // 2]:.3f}, max {ordered[-1]:.3f} "
                 f"over {len(per)}")
    scored = summary.get("per_rank_val_examples")  # null (or absent, before it existed): the whole test set
    if scored is not None and per is not None:
        shown += f" on {scored:,} test examples"
    diverged = summary.get("diverged_at_step")
    stopped = ("" if diverged is None else f"stopped after step {diverged}: the mean training loss since the log "
               f"line before, {summary['final_train_loss']:.4g}, is NaN, infinite or above --divergence-loss\n")
    if summary.get("headline_measure") == "partition_mean":   # models differ: the partitions' own lead
        accuracy = (f"mean val accuracy of the partitions' own models {summary['headline_val_accuracy']:.4f} ({shown}; "
                    f"the average of their weights, a model no partition holds: {summary['final_val_accuracy']:.4f}), ")
    else:
        accuracy = f"final val accuracy {summary['final_val_accuracy']:.4f} ({summary['final_model']} model; {shown}), "
    return (f"{stopped}done: {accuracy}"
            f"WAN bytes {human_bytes(summary['wan_bytes_total'])} ({summary['wan_bytes_total']:,} B), "
            f"emulated {summary['emulated_seconds']:.1f} s, wall {summary['wall_seconds']:.1f} s\n"
            f"{_vs_bsp_line(summary)}"
            f"run directory: {out}")
