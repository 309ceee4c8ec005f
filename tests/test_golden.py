"""The engine keeps every run's outputs bit for bit: the golden matrix (tests/golden/cells.py).

Each cell's records were written from commit c3a6901 (before the one-engine change) on each of its
process counts; a run now must reproduce them exactly (summary.json and config.json without the
clock's fields, every metrics.jsonl line without ``wall_s`` / ``emulated_s``, partitions.json, every
tensor of every model file). The cells marked ``suite`` run in every suite run; the whole matrix
runs with ``pytest -m golden_full tests/test_golden.py`` (about 15 minutes on 2 cores).

``--partition-scores auto`` (the default since the change) leaves summary.json's per-partition
scores null where every partition holds a copy of a global model of some round (BSP and DGC without
BatchNorm, the FedAvg family): those two fields are compared only where a run reports them, and
``test_partition_scores_all_reproduces_the_records`` runs cells of both kinds with ``--partition-scores
all`` against their records in full.

The one stated exception (EXCEPTIONS): FedAvgM's ``fedavgm_server_momentum_norm`` with client
sampling. Before the change the pool engine (P > R, picked by ``--engine auto``) logged the server's
momentum and one partition per process (P = R) logged partition 0's own copy, stale when partition
0 sat the round out, so the records of R < P and R = P disagreed already; the one engine logs
partition 0's copy on every R, so each run must equal the record of R = P in that field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.golden.cells import BY_NAME, CELLS, Cell
from tests.golden.record import DATA, drop_unscored, first_difference, normalize, run_cell

EXCEPTIONS = {"fedavgm_server_momentum_norm"}
"""metrics.jsonl fields where records of different process counts disagreed before (module docstring)."""


def _without(record: object, names: set[str]) -> object:
    if isinstance(record, dict):
        return {k: _without(v, names) for k, v in record.items() if k not in names}
    if isinstance(record, list):
        return [_without(v, names) for v in record]
    return record


def _params() -> list:
    out = []
    for cell in CELLS:
        for r in cell.processes:
            marks = [pytest.mark.integration] + ([] if cell.suite and r in (cell.processes[0], cell.processes[-1])
                                                 else [pytest.mark.golden_full])
            out.append(pytest.param(cell, r, id=f"{cell.name}-R{r}", marks=marks))
    return out


@pytest.mark.parametrize(("cell", "processes"), _params())
def test_run_equals_its_golden_record(cell: Cell, processes: int, tmp_path: Path) -> None:
    doc = json.loads((DATA / f"{cell.name}.json").read_text())
    assert doc["argv"] == cell.full_argv, "the cell's flags changed since its record"
    got = run_cell(cell, processes, tmp_path / "run")
    for rec in (doc["record"], *doc["per_process"].values()):
        drop_unscored(got, rec)
    want = normalize(doc["record"])
    disagreed = {r: normalize(rec) for r, rec in doc["per_process"].items()}
    if disagreed:  # the exception: every R reports what R = P reported before
        assert all(first_difference(_without(want, EXCEPTIONS), _without(rec, EXCEPTIONS)) is None
                   for rec in disagreed.values()), "records of process counts disagree beyond EXCEPTIONS"
        want_exact = disagreed.get(str(max(cell.processes)), want)
        assert first_difference(want_exact, got) is None, first_difference(want_exact, got)
        return
    diff = first_difference(want, got)
    assert diff is None, f"{cell.name} on {processes} process(es) differs from its golden record at {diff}"


def test_every_cell_has_a_record_and_every_record_a_cell() -> None:
    stored = {p.stem for p in DATA.glob("*.json")}
    assert stored == {c.name for c in CELLS}


@pytest.mark.integration
@pytest.mark.parametrize("name", ["fedavg-sampled-fedavgm-fedprox", "bsp"])
def test_partition_scores_all_reproduces_the_records(name: str, tmp_path: Path) -> None:
    """With --partition-scores all every partition's own model is scored as before the change: the
    whole record, the per-partition scores included (the default leaves them null for these cells)."""
    import dataclasses
    base = BY_NAME[name]
    cell = dataclasses.replace(base, argv=[*base.argv, "--partition-scores", "all"])
    doc = json.loads((DATA / f"{name}.json").read_text())
    want = normalize(doc["per_process"].get(str(max(base.processes)), doc["record"]))
    got = run_cell(cell, 1, tmp_path / "run")
    assert got["summary"]["per_rank_val_accuracy"] is not None
    assert first_difference(want, got) is None, first_difference(want, got)
    default = run_cell(base, 1, tmp_path / "default")
    assert default["summary"]["per_rank_val_accuracy"] is None and default["summary"]["per_rank_train_accuracy"] is None
