"""The public Python API and plugins (issue 66): geodml.run, --algo/--model/--dataset/--partition
MODULE:ATTRIBUTE and entry points, a plugin's own options, and the worked example
examples/topk_fedavg.py (its equivalence with FedAvg at --topk-fraction 1 and its byte count)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import geodml
from geodml import plugins
from geodml.cli import parse_config
from geodml.config import API_ALGOS
from tests.support.procs import run_command

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
TOPK = "topk_fedavg:TopKFedAvg"


@pytest.fixture(autouse=True)
def _examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    plugins.forget()
    yield
    plugins.forget()


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(EXAMPLES), str(REPO), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "GEODML_PROCESSES": "1", "OMP_NUM_THREADS": "1"}


def _model(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "model.pt", map_location="cpu", weights_only=True)


def _same_weights(a: Path, b: Path) -> None:
    ma, mb = _model(a), _model(b)
    assert ma.keys() == mb.keys()
    for k in ma:
        assert torch.equal(ma[k], mb[k]), k


SMALL = ["--dataset", "digits", "--partitions", "4", "--steps", "20", "--no-progress", "--eval-every", "10"]


# ---- the public names ---------------------------------------------------------------------
def test_public_names_import_from_geodml():
    import geodml.algorithm as api
    from geodml import Algorithm, InputError, KnobSpec, RunConfig, RunResult, run  # noqa: F401
    for name in api.__all__:
        assert getattr(api, name) is not None, name
    assert geodml.Algorithm is api.Algorithm and geodml.RunConfig is api.RunConfig
    assert issubclass(geodml.InputError, ValueError)
    with pytest.raises(AttributeError):
        geodml.no_such_name  # noqa: B018


# ---- geodml.run -----------------------------------------------------------------------------
def test_run_returns_summary_metrics_and_out_and_the_three_forms_agree(tmp_path):
    r = geodml.run(["--algo", "fedavg", "--iter-local", "5", *SMALL, "--out", str(tmp_path / "list")])
    assert r.out == tmp_path / "list" and (r.out / "summary.json").exists()
    assert r.summary == json.loads((r.out / "summary.json").read_text())
    assert 0.0 < r.summary["final_val_accuracy"] <= 1.0
    assert r.summary["wan_bytes_total"] > 0
    lines = (r.out / "metrics.jsonl").read_text().splitlines()
    assert len(r.metrics) == len(lines) > 0 and r.metrics[-1] == json.loads(lines[-1])
    assert r.config.fedavg.iter_local == 5
    d = geodml.run({"algo": "fedavg", "iter-local": 5, "dataset": "digits", "partitions": 4, "steps": 20,
                    "progress": False, "eval_every": 10, "out": str(tmp_path / "dict")})
    cfg = parse_config(["--algo", "fedavg", "--iter-local", "5", *SMALL, "--out", str(tmp_path / "cfg")])
    c = geodml.run(cfg)
    assert cfg.out == str(tmp_path / "cfg")  # a RunConfig is copied, not changed
    for other in (d, c):
        _same_weights(r.out, other.out)
        assert other.summary["wan_bytes_by_link"] == r.summary["wan_bytes_by_link"]
        assert other.summary["final_val_accuracy"] == r.summary["final_val_accuracy"]


@pytest.mark.parametrize("config,message", [
    (["--lr", "-1"], "--lr must be > 0, got -1.0"),
    ({"lr": -1}, "--lr must be > 0, got -1"),
    ({"no-such": 1}, "unknown setting 'no-such' (keys are flag names such as lr, algo, lr-milestones)"),
    ({"steps": "ten"}, 'steps = "ten" is a string; expected an integer'),
    (["--algo", "nomodule_xyz:Thing"], "--algo nomodule_xyz:Thing: cannot import module 'nomodule_xyz'"),
    (["--algo", "topk_fedavg:NoSuch"], "--algo topk_fedavg:NoSuch: module topk_fedavg has no attribute 'NoSuch'"),
    (["--algo", "nosuchname"], "--algo: unknown algorithm 'nosuchname'; choose one of bsp, gaia, dgc, fedavg, "
                               f"local, {', '.join(API_ALGOS)}, or a plugin MODULE:CLASS"),
    (["--algo", TOPK, "--topk-fraction", "1.5"], "--topk-fraction must be in (0, 1], got 1.5"),
    (["--topk-fraction", "0.5"], "unrecognized arguments: --topk-fraction 0.5"),
    (["--processes", "2"], "--processes 2: geodml.run hosts every partition in the calling process"),
])
def test_bad_input_raises_input_error_with_the_cli_text(tmp_path, monkeypatch, config, message):
    monkeypatch.chdir(tmp_path)   # where a default run directory (runs/...) would appear
    with pytest.raises(geodml.InputError) as err:
        geodml.run(config)
    assert str(err.value).startswith(message), str(err.value)
    assert list(tmp_path.iterdir()) == []   # nothing started, nothing written


@pytest.mark.integration
def test_the_api_error_is_the_cli_error_line_and_the_run_equals_the_cli(tmp_path):
    args = ["--algo", TOPK, "--topk-fraction", "1.5", *SMALL]
    r = run_command([sys.executable, "-m", "geodml", *args], timeout_s=120, env=_env())
    assert r.returncode == 2
    first = r.stderr.splitlines()[0]
    with pytest.raises(geodml.InputError) as err:
        geodml.run(args)
    assert first == f"geodml: error: {err.value}"
    good = ["--algo", TOPK, "--topk-fraction", "0.3", "--iter-local", "5", *SMALL]
    r = run_command([sys.executable, "-m", "geodml", *good, "--out", str(tmp_path / "cli")], timeout_s=240, env=_env())
    assert r.returncode == 0, r.stderr[-2000:]
    api = geodml.run([*good, "--out", str(tmp_path / "api")])
    _same_weights(tmp_path / "cli", api.out)
    cli_summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert cli_summary["wan_bytes_by_link"] == api.summary["wan_bytes_by_link"]


# ---- the worked example: TopKFedAvg -----------------------------------------------------------
def _param_and_buffer_counts() -> tuple[int, int]:
    from geodml.models import build_model
    m = build_model("cnn", "batch", (1, 8, 8), 10)
    n = sum(p.numel() for p in m.parameters())
    nbuf = sum(b.numel() for b in m.buffers() if b.is_floating_point())
    return n, nbuf


def _envelope(arrays_shapes: list[tuple[str, int]]) -> int:
    from geodml.comm.wire import envelope_nbytes
    return envelope_nbytes("model", 2, 1, [np.empty(k, dtype=dt) for dt, k in arrays_shapes])


ROUNDS = ["--dataset", "digits", "--partitions", "4", "--client-fraction", "0.5", "--model", "cnn", "--norm", "batch",
          "--steps", "40", "--iter-local", "10", "--no-progress", "--eval-every", "20"]


def test_topk_at_fraction_1_is_fedavg_bit_for_bit_and_its_bytes_follow_its_encoding(tmp_path, monkeypatch):
    """m = 2 of 4 participants a round (FedAvg's star through the round's first participant), BatchNorm
    buffers in the message, 4 rounds. At fraction 1 the weights are FedAvg's bit for bit; the only byte
    difference is the upload's encoding: per round one upload of int32 indices + float32 values + the
    buffers instead of FedAvg's float32 [update | buffers], each with its envelope. Shared scratch is
    poisoned at every switch between partitions (docs/architecture.md): the plugin must not read it
    across a wait."""
    monkeypatch.setenv("GEODML_POISON_SCRATCH", "1")
    fed = geodml.run(["--algo", "fedavg", *ROUNDS, "--out", str(tmp_path / "fedavg")])
    top = geodml.run(["--algo", TOPK, "--topk-fraction", "1", *ROUNDS, "--out", str(tmp_path / "topk1")])
    _same_weights(fed.out, top.out)
    assert top.summary["final_val_accuracy"] == fed.summary["final_val_accuracy"]
    n, nbuf = _param_and_buffer_counts()
    rounds, uploads_per_round = 4, 1
    fedavg_upload = 4 * (n + nbuf) + _envelope([("<f4", n + nbuf)])
    topk_upload = 4 * n + 4 * n + 4 * nbuf + _envelope([("<i4", n), ("<f4", n), ("<f4", nbuf)])
    diff = top.summary["wan_bytes_total"] - fed.summary["wan_bytes_total"]
    assert diff == rounds * uploads_per_round * (topk_upload - fedavg_upload)
    assert diff == rounds * (4 * n + _envelope([("<i4", n), ("<f4", n), ("<f4", nbuf)]) - _envelope([("<f4", n + nbuf)]))

    k = round(0.1 * n)
    sparse = geodml.run(["--algo", TOPK, "--topk-fraction", "0.1", *ROUNDS, "--out", str(tmp_path / "topk01")])
    sparse_upload = 8 * k + 4 * nbuf + _envelope([("<i4", k), ("<f4", k), ("<f4", nbuf)])
    assert sparse.summary["wan_bytes_total"] == fed.summary["wan_bytes_total"] + rounds * (sparse_upload - fedavg_upload)
    config = json.loads((sparse.out / "config.json").read_text())
    assert config["config"]["plugin"] == {"topk_fraction": 0.1}


class _OneRankComm:
    def recv_from(self, srcs, kind, *, step):
        assert list(srcs) == []
        return {}


def test_error_feedback_by_hand():
    """Two rounds on one participant (the leader alone) at fraction 0.5 of 4 entries: it contributes
    the 2 largest |e| of e = residual + delta and keeps the rest as its residual."""
    from topk_fedavg import TopKFedAvg

    a = TopKFedAvg.__new__(TopKFedAvg)   # only what sum_contributions reads
    a.topk_fraction, a.round = 0.5, 0
    a.residual = torch.zeros(4)
    a.flat = type("F", (), {"numel": 4})()
    a.ctx = type("C", (), {"rank": 0})()
    a.comm = _OneRankComm()
    deltas = iter([torch.tensor([3.0, -1.0, 0.5, 2.0]), torch.tensor([0.25, -0.5, 0.75, 0.125])])
    a.write_contribution = lambda buf, p: buf[:4].copy_(next(deltas))
    buf = torch.zeros(4)
    a.sum_contributions(buf, (0,), 1.0)
    assert buf.tolist() == [3.0, 0.0, 0.0, 2.0] and a.residual.tolist() == [0.0, -1.0, 0.5, 0.0]
    a.sum_contributions(buf, (0,), 1.0)       # e = [0.25, -1.5, 1.25, 0.125]
    assert buf.tolist() == [0.0, -1.5, 1.25, 0.0] and a.residual.tolist() == [0.25, 0.0, 0.0, 0.125]


@pytest.mark.integration
def test_the_readme_command_runs_and_two_processes_give_the_same_run(tmp_path):
    cmd = [sys.executable, "-m", "geodml", "--algo", TOPK, "--partitions", "4", "--dataset", "digits", "--epochs", "1"]
    one = run_command([*cmd, "--out", str(tmp_path / "r1")], timeout_s=240, env=_env())
    assert one.returncode == 0, one.stderr[-2000:]
    assert "final val accuracy" in one.stdout
    two = run_command([*cmd, "--processes", "2", "--out", str(tmp_path / "r2")], timeout_s=240, env=_env())
    assert two.returncode == 0, two.stderr[-2000:]
    _same_weights(tmp_path / "r1", tmp_path / "r2")
    s1, s2 = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("r1", "r2"))
    assert s1["wan_bytes_by_link"] == s2["wan_bytes_by_link"]


# ---- a plugin's options ---------------------------------------------------------------------
def test_plugin_options_help_toml_and_warnings(tmp_path, capsys):
    from geodml.cli import build_parser, plugin_of
    extra = plugin_of(TOPK)
    assert [o.flag for o in extra] == ["--topk-fraction"]
    text = " ".join(build_parser(extra).format_help().split())
    assert f"algorithm {TOPK}: --topk-fraction TOPK_FRACTION {TOPK}: fraction of the update's entries" in text
    assert "(default 0.1)" in text
    assert parse_config(["--algo", TOPK]).plugin.topk_fraction == 0.1
    toml = tmp_path / "run.toml"
    toml.write_text(f'algo = "{TOPK}"\ntopk-fraction = 0.3\niter-local = 7\n')
    cfg = parse_config(["--config", str(toml)])
    assert cfg.plugin.topk_fraction == 0.3 and cfg.fedavg.iter_local == 7
    assert parse_config(["--config", str(toml), "--topk-fraction", "0.03"]).plugin.topk_fraction == 0.03
    toml.write_text(f'algo = "{TOPK}"\ntopk-fraction = "much"\n')
    with pytest.raises(ValueError, match=r'topk-fraction = "much" is a string; expected a number'):
        parse_config(["--config", str(toml)])
    warned: list[str] = []
    parse_config(["--algo", TOPK, "--prox-mu", "0.1", "--iter-local", "5", "--t0", "0.2"], warn=warned.append)
    assert warned == [f"geodml: warning: --prox-mu, --t0 has no effect with --algo {TOPK}"]
    with pytest.raises(ValueError, match="RunConfig.plugin must be a TopKFedAvg.Config"):
        geodml.RunConfig(algo=parse_config([]).algo.__class__(algo=TOPK), plugin=object())


def test_plugin_option_clash_and_bare_fields_are_refused(tmp_path, monkeypatch):
    (tmp_path / "badplug.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass, field
        from geodml.algorithm import BSP, opt

        class Clash(BSP):
            @dataclass(kw_only=True)
            class Config:
                lr: float = opt(0.1, help="mine")

        class Bare(BSP):
            @dataclass(kw_only=True)
            class Config:
                alpha_x: float = 0.1

        class NoFactory:
            pass
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"--algo badplug:Clash: option\(s\) --lr of Clash.Config are geodml's own"):
        parse_config(["--algo", "badplug:Clash"])
    with pytest.raises(ValueError, match=r"Bare.Config field\(s\) alpha_x need opt\(...\) metadata"):
        parse_config(["--algo", "badplug:Bare"])
    with pytest.raises(ValueError, match=r"--algo badplug:NoFactory: has no from_config"):
        parse_config(["--algo", "badplug:NoFactory"])


# ---- everything ours get: SkewScout, checkpoints ----------------------------------------------
def test_skewscout_tunes_the_plugins_knob(tmp_path):
    r = geodml.run(["--algo", TOPK, "--topk-fraction", "0.3", *SMALL[:-2], "--steps", "50", "--iter-local", "5",
                    "--skewscout", "--travel-every", "10", "--out", str(tmp_path / "sk")])
    traj = r.summary["theta_trajectory"]
    assert [t["step"] for t in traj][:1] == [0] and len(traj) >= 2
    grid = set(geodml.KnobSpec("topk_fraction", (1.0, 0.3, 0.1, 0.03, 0.01)).grid)
    assert all(t["theta"] in grid for t in traj)
    assert r.summary["theta_final"] in grid


def test_a_plugin_run_resumes_from_its_checkpoint_to_the_same_weights(tmp_path):
    args = ["--algo", TOPK, "--topk-fraction", "0.1", *SMALL[:-2], "--steps", "40", "--iter-local", "5",
            "--checkpoint-every", "20"]
    full = geodml.run([*args, "--out", str(tmp_path / "full")])
    cut = tmp_path / "cut"
    import shutil
    shutil.copytree(full.out, cut)
    for p in [cut / "summary.json", *cut.glob("**/model.pt"), *cut.glob("rank*/ckpt-00000040.pt")]:
        p.unlink()
    assert sorted(p.name for p in cut.glob("rank*/ckpt-*.pt")) == ["ckpt-00000020.pt"] * 4
    resumed = geodml.run([*args, "--out", str(cut), "--resume"])
    _same_weights(full.out, resumed.out)
    assert resumed.summary["wan_bytes_total"] == full.summary["wan_bytes_total"]
    with pytest.raises(geodml.InputError, match=r"plugin.topk_fraction=0.1 but this run has plugin.topk_fraction=0.3"):
        (cut / "summary.json").unlink()
        geodml.run([*args[:2], "--topk-fraction", "0.3", *args[4:], "--out", str(cut), "--resume"])


# ---- entry points ---------------------------------------------------------------------------
def _site_with_entry_point(site: Path) -> None:
    pkg = site / "geodml_topk_demo"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text((EXAMPLES / "topk_fedavg.py").read_text())
    dist = site / "geodml_topk_demo-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: geodml-topk-demo\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[geodml.algorithms]\ntopk = geodml_topk_demo:TopKFedAvg\n")


def test_an_entry_point_names_the_plugin(tmp_path, monkeypatch):
    site = tmp_path / "site"
    _site_with_entry_point(site)
    monkeypatch.syspath_prepend(str(site))
    assert "topk" in plugins.registered("algo")
    cfg = parse_config(["--algo", "topk", "--topk-fraction", "0.3"])
    assert type(cfg.plugin).__module__ == "geodml_topk_demo" and cfg.plugin.topk_fraction == 0.3
    with pytest.raises(ValueError, match="--algo: unknown algorithm 'topkk'"):
        parse_config(["--algo", "topkk"])


@pytest.mark.integration
def test_an_entry_point_in_a_site_directory_runs_from_the_command_line(tmp_path):
    site = tmp_path / "site"
    _site_with_entry_point(site)
    env = {**_env(), "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    r = run_command([sys.executable, "-m", "geodml", "--algo", "topk", "--topk-fraction", "0.3", *SMALL,
                     "--out", str(tmp_path / "ep")], timeout_s=240, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "ep" / "config.json").read_text())["config"]["plugin"] == {"topk_fraction": 0.3}


# ---- model, dataset and partitioner plugins ---------------------------------------------------
PLUGIN_PARTS = """
import numpy as np
import torch
from torch import nn


def tiny(input_shape, num_classes):
    c, h, w = input_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 16), nn.ReLU(), nn.Linear(16, num_classes))


def not_a_module(input_shape, num_classes):
    return 3


def blobs(seed, data_dir):
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 3, size=(3, 1, 4, 4))
    y = rng.integers(0, 3, size=300)
    x = centers[y] + rng.normal(0, 1, size=(300, 1, 4, 4))
    return x[:240].astype(np.float32), y[:240], x[240:].astype(np.float32), y[240:]


class RoundRobin:
    def split(self, labels, num_partitions, rng):
        return [np.arange(k, len(labels), num_partitions) for k in range(num_partitions)]


class Overlapping:
    def split(self, labels, num_partitions, rng):
        return [np.arange(len(labels))] * num_partitions
"""


def test_model_dataset_and_partitioner_plugins(tmp_path, monkeypatch):
    (tmp_path / "myparts.py").write_text(PLUGIN_PARTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["--algo", "fedavg", "--model", "myparts:tiny", "--dataset", "myparts:blobs", "--partition",
            "myparts:RoundRobin", "--partitions", "3", "--steps", "30", "--iter-local", "5", "--no-progress"]
    state = torch.get_rng_state()
    a = geodml.run([*args, "--out", str(tmp_path / "a")])
    assert torch.equal(torch.get_rng_state(), state)   # the seeded build leaves the global generator alone
    b = geodml.run([*args, "--out", str(tmp_path / "b")])
    _same_weights(a.out, b.out)
    parts = json.loads((a.out / "partitions.json").read_text())
    assert [sum(row) for row in parts["label_counts"]] == [80, 80, 80]
    assert a.summary["final_val_accuracy"] > 0.5   # three well-separated blobs
    assert set(_model(a.out)) == {"1.weight", "1.bias", "3.weight", "3.bias"}
    with pytest.raises(geodml.InputError, match="--norm batch: a plugin model .* builds its own normalization"):
        geodml.run([*args, "--norm", "batch"])
    with pytest.raises(geodml.InputError, match="--partition myparts:Overlapping: split returned partitions that "
                                                "share samples"):
        geodml.run([*args[:6], "--partition", "myparts:Overlapping", *args[8:], "--out", str(tmp_path / "c")])
    with pytest.raises(Exception, match="--model myparts:not_a_module: returned int, not a torch.nn.Module"):
        geodml.run([*args[:2], "--model", "myparts:not_a_module", *args[4:], "--out", str(tmp_path / "d")])


# ---- the second example: a sweep from Python ------------------------------------------------
@pytest.mark.integration
def test_the_sweep_example_prints_its_table(tmp_path):
    r = run_command([sys.executable, str(EXAMPLES / "sweep.py"), "--out", str(tmp_path / "sweep"), "--steps", "20"],
                    timeout_s=480, env=_env())
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith(("fedavg ", "TopKFedAvg "))]
    assert len(rows) == 8
    fed = {row[2]: float(row[4]) for row in rows if row[0] == "fedavg"}
    for row in rows:
        if row[0] == "TopKFedAvg":
            assert float(row[4]) < fed[row[2]]   # fewer bytes than FedAvg at every fraction < 1


# ---- experiment trackers: TensorBoard -----------------------------------------------------------
def _events(directory: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_events_read_back_equal_the_run_files(tmp_path):
    r = geodml.run(["--algo", "gaia", "--t0", "0.05", "--partitions", "3", "--dataset", "digits", "--steps", "40",
                    "--eval-every", "20", "--log-every", "10", "--no-progress", "--skewscout", "--travel-every", "20",
                    "--out", str(tmp_path / "run"), "--tensorboard", str(tmp_path / "tb")])
    ev = _events(tmp_path / "tb" / "run")
    lines = [m for m in r.metrics if "train_loss" in m]
    assert [s for s, _ in ev["train_loss"]] == [m["step"] for m in lines]
    assert [v for _, v in ev["train_loss"]] == pytest.approx([m["train_loss"] for m in lines], rel=1e-6)  # float32
    assert [s for s, _ in ev["wan_bytes_total"]] == [m["step"] for m in r.metrics if "wan_bytes_total" in m]
    evals = [m for m in r.metrics if "val_accuracy" in m]
    assert ev["accuracy_vs_wan_bytes"] == [(m["wan_bytes_total"], pytest.approx(m["val_accuracy"])) for m in evals]
    thetas = [m for m in r.metrics if "theta" in m]
    assert thetas and [s for s, _ in ev["theta"]] == [m["step"] for m in thetas]
    assert "accuracy_loss" in ev and "emulated_s" in ev and "gaia_threshold" in ev
    for link, nbytes in r.summary["wan_bytes_by_link"].items():
        assert ev[f"wan_bytes_by_link/{link}"] == [(40, float(nbytes))]
    assert ev["wan_bytes_by_kind/update"] == [(40, float(r.summary["wan_bytes_by_kind"]["update"]))]
    assert ev["final/final_val_accuracy"] == [(40, pytest.approx(r.summary["final_val_accuracy"]))]


def test_tensorboard_flag_without_the_package_is_one_clear_error(tmp_path, monkeypatch):
    import builtins
    real = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name == "tensorboard" or name.startswith("tensorboard."):
            raise ImportError("No module named 'tensorboard'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.raises(geodml.InputError, match=r"--tensorboard needs the tensorboard package .*pip install tensorboard"):
        geodml.run([*SMALL, "--out", str(tmp_path / "x"), "--tensorboard", str(tmp_path / "tb")])
    assert not (tmp_path / "x").exists() and not (tmp_path / "tb").exists()


def test_run_warns_about_settings_that_do_nothing_as_python_warnings(tmp_path):
    with pytest.warns(geodml.SettingWarning, match=r"^--t0 has no effect with --algo fedavg$"):
        geodml.run(["--algo", "fedavg", "--t0", "0.2", *SMALL, "--out", str(tmp_path / "w")])
