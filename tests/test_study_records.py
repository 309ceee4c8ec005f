"""Committed run records (geodml.study.records): a finished run kept without its weights, taken by the
study runner as a finished run on any machine."""

from __future__ import annotations

import gzip
import json

from geodml.study import records
from geodml.study.runner import RunSpec, launch_record, run_all


def _finished_run(d, argv=("--algo", "bsp"), nproc=2):
    d.mkdir(parents=True)
    spec = RunSpec(d.name, d, tuple(argv), nproc)
    (d / "launch.json").write_text(json.dumps(launch_record(spec)))
    (d / "config.json").write_text('{"world_size": 2}')
    (d / "partitions.json").write_text("{}")
    (d / "sources.json").write_text('{"geodml_sources_sha256": "abc"}')
    (d / "metrics.jsonl").write_text('{"step": 5, "val_accuracy": 0.5}\n{"step": 10, "val_accuracy": 0.75}\n')
    (d / "summary.json").write_text('{"final_val_accuracy": 0.75, "wan_bytes_total": 123}')
    (d / "model.pt").write_bytes(b"weights are not recorded")
    return spec


def test_a_record_holds_the_run_without_weights_and_restores_it(tmp_path):
    run = tmp_path / "study-x" / "bsp-s0"
    spec = _finished_run(run)
    root = tmp_path / "records"
    dest = records.save(run, root)
    assert dest == root / "study-x" / "bsp-s0"
    assert sorted(p.name for p in dest.iterdir()) == ["config.json", "launch.json", "metrics.jsonl.gz",
                                                     "partitions.json", "sources.json", "summary.json"]
    assert gzip.decompress((dest / "metrics.jsonl.gz").read_bytes()) == (run / "metrics.jsonl").read_bytes()
    fresh = tmp_path / "elsewhere" / "study-x" / "bsp-s0"
    assert records.restore(fresh, launch_record(spec), root)
    for name in ("summary.json", "metrics.jsonl", "config.json", "launch.json"):
        assert (fresh / name).read_bytes() == (run / name).read_bytes(), name
    assert not (fresh / "model.pt").exists()


def test_a_record_with_other_flags_or_unfinished_is_not_used(tmp_path):
    run = tmp_path / "study-x" / "bsp-s0"
    _finished_run(run)
    root = tmp_path / "records"
    records.save(run, root)
    other = RunSpec("bsp-s0", tmp_path / "b" / "study-x" / "bsp-s0", ("--algo", "gaia"), 2)
    assert not records.restore(other.out, launch_record(other), root) and not other.out.exists()
    (root / "study-x" / "bsp-s0" / "summary.json").unlink()  # an incomplete record
    same = RunSpec("bsp-s0", tmp_path / "c" / "study-x" / "bsp-s0", ("--algo", "bsp"), 2)
    assert not records.restore(same.out, launch_record(same), root)
    assert records.save(tmp_path / "study-x" / "missing", root) is None


def test_the_runner_reuses_a_committed_record_and_launches_nothing(tmp_path):
    root = tmp_path / "records"
    records.save(_finished_run(tmp_path / "old" / "study-y" / "r1").out, root)
    spec = RunSpec("r1", tmp_path / "new" / "study-y" / "r1", ("--algo", "bsp"), 2)
    logs: list[str] = []

    def never(*args, **kwargs):
        raise AssertionError("a recorded run was launched")

    [result] = run_all([spec], launcher=never, log=logs.append, records_root=root, checkpoint_every=0)
    assert result.status == "reused" and result.summary == {"final_val_accuracy": 0.75, "wan_bytes_total": 123}
    assert "its committed record" in logs[0]
    assert json.loads((spec.out / "metrics.jsonl").read_text().splitlines()[1])["val_accuracy"] == 0.75
