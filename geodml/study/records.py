"""Committed run records: a finished study run kept in the repository, so that no run is lost when a
session ends or a study continues on another machine.

A record is what a study report reads of a run, without its weights: ``launch.json`` (the flags it
was launched with), ``config.json``, ``summary.json``, ``partitions.json``, ``sources.json`` (the
geodml code it ran) and ``metrics.jsonl`` gzip-compressed. Records live in
``docs/study/records/<study directory name>/<run id>/``.

* ``python -m geodml.study.records save STUDY_DIR [...]`` copies every finished run of the study
  directories into the records (a run already recorded is left as it is).
* The study runner (geodml.study.runner.run_all) takes a record as a finished run: a run directory
  without ``summary.json`` whose record exists with the same ``launch.json`` is filled from the record
  (metrics decompressed) and reported as reused. A record with other flags is never used.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
RECORDS = REPO_ROOT / "docs" / "study" / "records"
"""Where the records live (one directory per study directory name)."""
FILES = ("launch.json", "config.json", "summary.json", "partitions.json", "sources.json")
"""A record's files besides the compressed metrics."""
METRICS = "metrics.jsonl"


def record_dir(run_dir: Path, root: Path = RECORDS) -> Path:
    """The record of the run in ``run_dir`` (its study directory's name, then its run id)."""
    run_dir = Path(run_dir)
    return root / run_dir.resolve().parent.name / run_dir.name


def save(run_dir: Path, root: Path = RECORDS) -> Path | None:
    """Record the finished run in ``run_dir`` (None: not finished, or launched by no study)."""
    run_dir = Path(run_dir)
    if not (run_dir / "summary.json").exists() or not (run_dir / "launch.json").exists():
        return None
    dest = record_dir(run_dir, root)
    if (dest / "summary.json").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        if (run_dir / name).exists():
            shutil.copyfile(run_dir / name, dest / name)
    with open(run_dir / METRICS, "rb") as src, open(dest / (METRICS + ".gz"), "wb") as raw, \
            gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as out:  # mtime 0: the same bytes every time
        shutil.copyfileobj(src, out)
    # summary.json last: a record without it is incomplete and is neither used nor kept
    shutil.copyfile(run_dir / "summary.json", dest / "summary.json")
    return dest


def restore(run_dir: Path, launch: dict, root: Path = RECORDS) -> bool:
    """Fill ``run_dir`` from its record when the record was launched with ``launch`` (the runner's
    launch record of the spec); True when it did. Nothing is written otherwise."""
    src = record_dir(Path(run_dir), root)
    if not (src / "summary.json").exists() or not (src / "launch.json").exists():
        return False
    try:
        if json.loads((src / "launch.json").read_text()) != launch:
            return False
    except ValueError:
        return False
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with gzip.open(src / (METRICS + ".gz"), "rb") as f, open(run_dir / METRICS, "wb") as out:
        shutil.copyfileobj(f, out)
    for name in FILES:
        if name != "summary.json" and (src / name).exists():
            shutil.copyfile(src / name, run_dir / name)
    shutil.copyfile(src / "summary.json", run_dir / "summary.json")  # last: the run is finished from here
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m geodml.study.records",
                                description="Commit-ready records of finished study runs (module docstring).")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save", help="record every finished run of these study directories")
    s.add_argument("studies", nargs="+", type=Path)
    a = p.parse_args(argv)
    for study in a.studies:
        if not study.is_dir():
            print(f"geodml.study.records: error: {study} is not a directory", file=sys.stderr)
            return 2
        runs = sorted(d for d in study.iterdir() if d.is_dir())
        saved = [d.name for d in runs if save(d) is not None]
        print(f"{study}: {len(saved)} finished run(s) recorded in {RECORDS / study.resolve().name}: {', '.join(saved)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
