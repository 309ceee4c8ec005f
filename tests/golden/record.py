"""Run golden cells and write (or check) their records: ``python -m tests.golden.record [--check] [CELL ...]``.

Without ``--check`` it writes ``tests/golden/data/<cell>.json`` (do that only on the commit the
records stand for: c3a6901, before the one-engine change; see tests/golden/cells.py). With
``--check`` it compares each run with the stored record and prints the first difference (what
tests/test_golden.py does, for a quick look by hand). Each cell runs on every process count it
names; a cell whose runs disagree between process counts is reported field by field.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from geodml.config import upgrade_config
from tests.golden.cells import (
    ADDED_OPTIONS,
    ADDED_SUMMARY,
    BY_NAME,
    CELLS,
    KERNEL_ENV,
    MEASURED_CONFIG,
    MEASURED_METRICS,
    MEASURED_SUMMARY,
    REMOVED_OPTIONS,
    Cell,
)

DATA = Path(__file__).resolve().parent / "data"
REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600


def _scrub(obj: object) -> object:
    """``obj`` without the clock's fields at any depth."""
    if isinstance(obj, dict):
        return {k: _scrub(v) for k, v in obj.items() if k not in MEASURED_METRICS}
    if isinstance(obj, list):
        return [_scrub(v) for v in obj]
    return obj


def tensor_digest(state: dict) -> dict[str, str]:
    """Per tensor of a state_dict: dtype, shape and a SHA-256 of its bytes."""
    import torch
    out = {}
    for name, t in state.items():
        if isinstance(t, torch.Tensor):
            t = t.detach().cpu().contiguous()
            raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            out[name] = f"{t.dtype}:{list(t.shape)}:{hashlib.sha256(raw).hexdigest()}"
        else:
            out[name] = repr(t)
    return out


def extract(out: Path) -> dict:
    """What a finished run directory reports, without what depends on the clock or the machine."""
    import torch
    summary = json.loads((out / "summary.json").read_text())
    for k in (*MEASURED_SUMMARY, *ADDED_SUMMARY):
        summary.pop(k, None)
    config = json.loads((out / "config.json").read_text())
    for k in (*MEASURED_CONFIG, "processes"):  # (how many processes ran it: results do not depend on it)
        config.pop(k, None)
    config.get("config", {}).pop("out", None)
    metrics = [_scrub(json.loads(line)) for line in (out / "metrics.jsonl").read_text().splitlines()]
    models = {}
    for f in sorted(out.rglob("model.pt")):
        models[str(f.relative_to(out))] = tensor_digest(torch.load(f, weights_only=True))
    return normalize({"summary": _scrub(summary), "config": _scrub(config),
                      "partitions": json.loads((out / "partitions.json").read_text()), "metrics": metrics,
                      "models": models})


def normalize(record: dict) -> dict:
    """``record`` without the options that no longer exist (REMOVED_OPTIONS), its algorithms' options in their
    sections (geodml.config.upgrade_config: the records were written when ``algo`` held them all): a stored
    record and a new run compare on what both have."""
    config = upgrade_config(record["config"].get("config", {}))   # records predate the algo sections' split
    record["config"]["config"] = config
    for k in REMOVED_OPTIONS:
        config.pop(k, None)
    for name, default in ADDED_OPTIONS.items():
        *section, k = name.split(".")
        where = config.get(section[0], {}) if section else config
        if k in where and where[k] == default:
            where.pop(k)
            if section and not where:   # a section of added options only (--compress's)
                config.pop(section[0])
    return record


SCORES = ("per_rank_val_accuracy", "per_rank_train_accuracy")
"""summary.json's per-partition scores (null under ``--partition-scores auto`` where partitions hold global models)."""


def drop_unscored(got: dict, want: dict) -> None:
    """Drop from both records the per-partition scores that ``got`` did not compute (tests/test_golden.py)."""
    for key in SCORES:
        if got["summary"].get(key) is None:
            got["summary"].pop(key, None)
            want["summary"].pop(key, None)


def command(cell: Cell, processes: int, out: Path) -> list[str]:
    argv = [*cell.full_argv, "--out", str(out)]
    if processes == 1 and cell.resume_at is None:
        return [sys.executable, "-m", "geodml", *argv, "--processes", "1"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
            *(["--max-restarts", "1"] if cell.resume_at is not None else []), "-m", "geodml", *argv]


def env_for(cell: Cell) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                              "MASTER_ADDR", "MASTER_PORT", "GEODML_FAULT")}
    env.update(KERNEL_ENV)
    env.update(cell.env)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if cell.resume_at is not None:
        env["GEODML_FAULT"] = f"rank=0,step={cell.resume_at},how=kill"
    return env


def run_cell(cell: Cell, processes: int, out: Path) -> dict:
    """One run of ``cell`` on ``processes`` processes into ``out``; its record (AssertionError when it fails)."""
    r = subprocess.run(command(cell, processes, out), env=env_for(cell), cwd=REPO, capture_output=True, text=True,
                       timeout=TIMEOUT_S, start_new_session=True)
    if r.returncode != 0:
        raise AssertionError(f"{cell.name} on {processes} process(es) failed ({r.returncode}):\n{r.stderr[-3000:]}")
    if cell.resume_at is not None:
        assert f"dies after step {cell.resume_at}" in r.stderr, r.stderr[-2000:]
        assert "resumed from step" in r.stdout, r.stdout[-2000:]
    return extract(out)


def first_difference(a: object, b: object, path: str = "") -> str | None:
    """Where two records first differ (None: equal)."""
    if type(a) is not type(b):
        return f"{path}: {a!r} != {b!r}"
    if isinstance(a, dict):
        assert isinstance(b, dict)
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}/{k}: only in {'the first' if k in a else 'the second'}"
            d = first_difference(a[k], b[k], f"{path}/{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        assert isinstance(b, list)
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {a!r} != {b!r}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.golden.record")
    p.add_argument("cells", nargs="*", help="cell names (default: every cell)")
    p.add_argument("--check", action="store_true", help="compare with the stored records instead of writing them")
    p.add_argument("--missing", action="store_true", help="record only the cells that have no record yet")
    a = p.parse_args(argv)
    cells = [BY_NAME[n] for n in a.cells] if a.cells else CELLS
    if a.missing:
        cells = [c for c in cells if not (DATA / f"{c.name}.json").exists()]
    DATA.mkdir(exist_ok=True)
    bad = 0
    for cell in cells:
        try:
            with tempfile.TemporaryDirectory(prefix=f"golden-{cell.name}-") as tmp:
                records = {r: run_cell(cell, r, Path(tmp) / f"r{r}") for r in cell.processes}
        except (AssertionError, subprocess.TimeoutExpired) as exc:
            print(f"{cell.name}: FAILED: {exc}", flush=True)
            bad += 1
            continue
        ref = records[cell.processes[0]]
        disagree = {r: d for r, rec in records.items() if (d := first_difference(ref, rec))}
        for r, d in disagree.items():
            print(f"{cell.name}: R={r} differs from R={cell.processes[0]} at {d}", flush=True)
        if a.check:
            want = json.loads((DATA / f"{cell.name}.json").read_text())
            for r, rec in records.items():
                # where process counts disagreed before, every R now reports what R = P did (tests/test_golden.py)
                ref = normalize(want["per_process"].get(str(max(cell.processes)), want["record"]))
                drop_unscored(rec, ref)
                d = first_difference(ref, rec)
                bad += d is not None
                print(f"{cell.name} R={r}: {'ok' if d is None else 'DIFFERS at ' + d}", flush=True)
            continue
        doc = {"cell": cell.name, "argv": cell.full_argv, "processes": list(cell.processes),
               "recorded_from": "c3a6901", "record": ref,
               "per_process": {str(r): records[r] for r in disagree}}
        (DATA / f"{cell.name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"{cell.name}: recorded ({', '.join(f'R={r}' for r in cell.processes)}; "
              f"{len(disagree)} process count(s) disagree)", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
