"""Checkpoint and resume (issue 10 item 1; docs/reliability.md).

Every ``--checkpoint-every N`` steps each rank writes its full state to
``<out>/rank<k>/ckpt-<step:08d>.pt``, atomically (written to ``.tmp``, fsynced, renamed): the
model (weights and BatchNorm buffers), the algorithm's state object (momentum ``u`` -- the
optimizer of vanilla momentum SGD -- and residuals, accumulators, thresholds, server momentum,
round counters, generators), the minibatch sampler (generator and position in the current
permutation), the trainer's step and metric accumulators, torch's global generator, the
Comm's ledger totals and emulated clock, and SkewScout's controller (memo, index, generator)
and trajectory.

After writing, every rank meets in one uncharged barrier; only then does a rank delete its
older checkpoints. So whenever a rank dies, the newest step that *every* rank has on disk is
either the one being written or the previous one, and ``--resume`` (or a torchrun
``--max-restarts`` restart, which implies it) continues from that step. Because the ledger
is restored from the checkpoint and the work after it is redone, a resumed run neither loses
nor double-counts bytes, and with the deterministic CPU setting its final weights equal an
uninterrupted run's bit for bit (tests/test_checkpoint.py).

Files are read with ``torch.load(weights_only=True)``: a checkpoint holds tensors and plain
Python values only. A corrupt file, one from another run (different flags that change the
training, world size, rank or topology) or an unknown format raises ``ValueError`` naming the
file and the difference -- checked on every rank before any process group is created. A
setting the checkpoint's fingerprint lacks (it was written by a geodml older than the setting)
is taken to have had its default, so the checkpoint resumes a run that leaves it at the default.
"""

from __future__ import annotations

import functools
import math
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from geodml import rundir
from geodml.config import RunConfig, upgrade_setting_key
from geodml.errors import StorageError

if TYPE_CHECKING:
    from geodml.trainer import Trainer

FORMAT = 1
"""Version of the checkpoint layout; bumped when its keys change."""
_NAME = re.compile(r"^ckpt-(\d{8})\.pt$")

# RunConfig fields that change the training (a checkpoint only resumes a run with the same ones).
_FINGERPRINT_SECTIONS = ("data", "model", "optim", "algo", "gaia", "dgc", "fedavg", "compression", "skewscout")
_FINGERPRINT_TOP = ("seed",)
_FINGERPRINT_COMM = ("topology", "wan", "wan_scale", "compute_s_per_step")
_NOT_FINGERPRINTED = ("data.data_dir", "data.cache")  # where the same data lives may change between attempts


def checkpoint_path(out: Path | str, rank: int, step: int) -> Path:
    return rundir.rank_dir(out, rank) / f"ckpt-{step:08d}.pt"


def list_steps(out: Path | str, rank: int) -> list[int]:
    """Steps of the complete checkpoint files of ``rank`` under ``out`` (ascending; ``.tmp`` ignored)."""
    d = rundir.rank_dir(out, rank)
    if not d.is_dir():
        return []
    return sorted(int(m.group(1)) for m in (_NAME.match(p.name) for p in d.iterdir()) if m)


def checkpoint_files(out: Path | str) -> list[Path]:
    """Every checkpoint file under ``out`` (complete ones and ``.tmp`` leftovers of a write cut short), of
    every rank directory: what a finished run no longer needs (geodml.study.runner deletes them)."""
    return sorted(p for p in Path(out).glob("rank*/ckpt-*.pt*") if p.is_file() and p.parent.name[4:].isdigit())


def fingerprint(cfg: RunConfig, world_size: int) -> dict[str, Any]:
    """The settings a checkpoint must share with the run that resumes it, as ``{"section.field": value}``
    (computed once per configuration and process: a process may host thousands of partitions)."""
    last = _LAST_FINGERPRINT
    if last and last[0] is cfg and last[1] == world_size:
        return dict(last[2])
    fp = _fingerprint(cfg, world_size)
    _LAST_FINGERPRINT[:] = [cfg, world_size, fp]
    return dict(fp)


_LAST_FINGERPRINT: list[Any] = []
"""The last configuration fingerprinted, its world size and fingerprint (RunConfig is not hashable)."""


def _fingerprint(cfg: RunConfig, world_size: int) -> dict[str, Any]:
    d = cfg.to_dict()
    fp: dict[str, Any] = {"world_size": world_size}
    for sec in _FINGERPRINT_SECTIONS:
        for k, v in d[sec].items():
            if f"{sec}.{k}" not in _NOT_FINGERPRINTED:
                fp[f"{sec}.{k}"] = list(v) if isinstance(v, tuple) else v
    for k in _FINGERPRINT_TOP:
        fp[k] = d[k]
    for k in _FINGERPRINT_COMM:
        fp[f"comm.{k}"] = d["comm"][k]
    for k, v in (d.get("plugin") or {}).items():   # a plugin algorithm's own options (geodml.plugins)
        fp[f"plugin.{k}"] = list(v) if isinstance(v, tuple) else v
    return fp


@functools.cache
def _defaults() -> dict[str, Any]:
    """The fingerprint of every setting at its default (what a checkpoint older than a setting ran with)."""
    return fingerprint(RunConfig(), 0)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to ``path.tmp``, fsync, rename over ``path``: a crash leaves the old file or the new one."""
    rundir.save_torch(path, obj, fsync=True, what="checkpoint")


def load_checkpoint(path: Path) -> dict:
    """Read one checkpoint file; ``ValueError`` naming the file when it is not a readable geodml checkpoint."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"checkpoint {path} does not exist") from None
    except Exception as exc:  # truncated zip, garbage bytes, foreign pickle: all the same to the user
        raise ValueError(f"checkpoint {path} is corrupt or not a geodml checkpoint ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:160] if str(exc) else 'unreadable'}); remove it (and the same "
                         "step of the other ranks) to resume from an older one, or choose another --out") from None
    if not isinstance(data, dict) or "format" not in data:
        raise ValueError(f"checkpoint {path} is not a geodml checkpoint (no format field)")
    return data


def validate(data: dict, path: Path, *, rank: int, step: int | None, fp: dict[str, Any]) -> None:
    """Raise ``ValueError`` if ``data`` cannot resume this run's ``rank`` (at ``step``, when given)."""
    if data.get("format") != FORMAT:
        raise ValueError(f"checkpoint {path} has format {data.get('format')!r}; this geodml reads format {FORMAT}")
    missing = [k for k in ("step", "rank", "fingerprint", "model", "algo", "sampler", "train_state") if k not in data]
    if missing:
        raise ValueError(f"checkpoint {path} is incomplete: missing {', '.join(missing)}")
    if data["rank"] != rank:
        raise ValueError(f"checkpoint {path} belongs to rank {data['rank']}, not rank {rank}; "
                         "rank directories were mixed up")
    if step is not None and data["step"] != step:
        raise ValueError(f"checkpoint {path} holds step {data['step']}, but its name says step {step}")
    saved = {upgrade_setting_key(k): v for k, v in data["fingerprint"].items()}  # "algo.t0" before the split
    for key in sorted(set(saved) | set(fp)):
        older = key not in saved   # written by a geodml before this setting existed: that run had its default
        was = _defaults().get(key) if older else saved[key]
        if _same(was, fp.get(key)):
            continue
        flag = "--" + key.split(".")[-1].replace("_", "-") if key != "world_size" else "the number of processes"
        if older:
            raise ValueError(f"checkpoint {path} was written before {key} existed, so with its default {was!r}, "
                             f"but this run has {key}={fp[key]!r}; resume with {flag} at its default or choose "
                             "another --out")
        raise ValueError(f"checkpoint {path} was written with {key}={was!r} but this run has "
                         f"{key}={fp.get(key)!r}; resume with the same {flag} or choose another --out")


def restarting() -> bool:
    """This process is a torchrun restart (TORCHELASTIC_RESTART_COUNT > 0)."""
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return restarts.isdigit() and int(restarts) > 0


def resume_requested(cfg: RunConfig) -> bool:
    """--resume, or a torchrun restart (TORCHELASTIC_RESTART_COUNT > 0) of a run that checkpoints."""
    return bool(cfg.reliability.resume) or restarting()


def find_resume_step(out: Path | str, world_size: int, fp: dict[str, Any]) -> int | None:
    """Newest step every rank has a checkpoint of (None: start fresh); validates those files and
    each rank's newest one. Pure file-system work, identical on every rank of one node."""
    steps = [list_steps(out, r) for r in range(world_size)]
    for r, st in enumerate(steps):  # the newest file of every rank must belong to this run
        if st:
            path = checkpoint_path(out, r, st[-1])
            validate(load_checkpoint(path), path, rank=r, step=st[-1], fp=fp)
    extra = sorted(p.name for p in Path(out).glob("rank*") if p.is_dir() and p.name[4:].isdigit()
                   and int(p.name[4:]) >= world_size and list_steps(out, int(p.name[4:])))
    if extra:
        raise ValueError(f"--out {out} has checkpoints of {', '.join(extra)}, so it was written by a run with more "
                         f"than {world_size} processes; resume with the same number of processes")
    common = set(steps[0]).intersection(*steps[1:]) if steps else set()
    if not common:
        return None
    step = max(common)
    for r in range(world_size):
        if steps[r][-1] != step:
            path = checkpoint_path(out, r, step)
            validate(load_checkpoint(path), path, rank=r, step=step, fp=fp)
    return step


def check_before_start(cfg: RunConfig, world_size: int) -> None:
    """The flag and file checks of checkpoint/resume (raises ValueError; before any process group)."""
    rel = cfg.reliability
    if rel.resume and cfg.out is None:
        raise ValueError("--resume needs the run directory to continue: give --out DIR")
    if rel.checkpoint_every and cfg.out is None:
        raise ValueError("--checkpoint-every needs a run directory a restart can find: give --out DIR")
    if cfg.out is None:
        return
    out = Path(cfg.out)
    if not out.is_dir():
        return
    fp = fingerprint(cfg, world_size)
    if resume_requested(cfg):
        find_resume_step(out, world_size, fp)
    elif not rel.restart and any(list_steps(out, int(p.name[4:])) for p in out.glob("rank*") if p.name[4:].isdigit()):
        raise ValueError(f"--out {out} holds checkpoints of an earlier run; pass --resume to continue it, --restart "
                         "to start it afresh there, or choose another --out")


# ---- capture and restore ------------------------------------------------------------------
class Checkpointer:
    """The trainer's step hook that writes checkpoints, and the restore of one (see module doc).

    A checkpoint is the trainer's ``state_dict()`` plus this header: ``format``, ``step``,
    ``rank``, ``world_size``, ``fingerprint`` (the settings a resume must share) and
    ``written_unix_s``."""

    def __init__(self, out: Path | str, *, rank: int, world_size: int, every_steps: int, fp: dict[str, Any]) -> None:
        self.out = Path(out)
        self.rank, self.world_size = rank, world_size
        self.every_steps = int(every_steps)
        self.fp = fp
        self.saved_steps: list[int] = []
        self._barrier = torch.zeros(1)

    # ---- save ----------------------------------------------------------------------------
    def __call__(self, trainer: Trainer) -> None:
        step = trainer.state.step
        due = step % self.every_steps == 0 if self.every_steps else False
        if self.every_steps and (due or trainer.interrupt_signum) and step < trainer.total_steps:
            self.save(trainer)   # periodic, or where a signal ends the run (geodml.interrupt)

    def capture(self, trainer: Trainer) -> dict:
        return {"format": FORMAT, "step": trainer.state.step, "rank": self.rank, "world_size": self.world_size,
                "fingerprint": self.fp, "written_unix_s": time.time(), **trainer.state_dict()}

    def save(self, trainer: Trainer) -> Path:
        step = trainer.state.step
        path = checkpoint_path(self.out, self.rank, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            atomic_save(self.capture(trainer), path)
        except StorageError as exc:
            kept = [s for s in list_steps(self.out, self.rank) if s < step]
            raise StorageError(f"{exc} at step {step}; "
                               + (f"the last complete checkpoint, step {kept[-1]}, is intact: {exc.remedy} and "
                                  "run the same command with --resume" if kept else
                                  "no earlier checkpoint: the run cannot be resumed"), exc.remedy) from None
        self.saved_steps.append(step)
        if self.world_size > 1:
            trainer.comm.meta_all_reduce(self._barrier)  # every rank has `step` on disk (uncharged barrier)
        for old in list_steps(self.out, self.rank):
            if old < step:
                checkpoint_path(self.out, self.rank, old).unlink(missing_ok=True)
        return path

    # ---- restore -------------------------------------------------------------------------
    def restore(self, trainer: Trainer, step: int) -> None:
        """Load this rank's checkpoint of ``step`` into a freshly built trainer (and its parts)."""
        path = checkpoint_path(self.out, self.rank, step)
        data = load_checkpoint(path)
        validate(data, path, rank=self.rank, step=step, fp=self.fp)
        try:
            trainer.load_state_dict(data)
        except ValueError:
            raise
        except (KeyError, RuntimeError, TypeError, IndexError) as exc:
            raise ValueError(f"checkpoint {path} does not fit this run's model/algorithm "
                             f"({type(exc).__name__}: {str(exc)[:200]})") from None


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the metrics.jsonl lines of steps <= ``step`` (a resumed run writes the later ones again)."""
    import json

    if not path.exists():
        return
    keep = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if int(json.loads(line).get("step", 0)) <= step:
                keep.append(line)
        except (ValueError, AttributeError, TypeError):
            break  # a torn last line from the crash
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(k + "\n" for k in keep), encoding="utf-8")
    os.replace(tmp, path)
