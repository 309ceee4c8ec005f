"""The study runner resumes a run cut short from its checkpoints (geodml.study.runner) instead of
starting it again: launched with ``--checkpoint-every`` (not part of the run's identity) and, after an
interruption, with ``--resume``; the result equals an uninterrupted run's bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from geodml.study import common
from geodml.study.runner import (
    AUTO_CHECKPOINT_STEPS,
    RunSpec,
    auto_checkpoint_every,
    launch_record,
    run_all,
    torchrun_command,
    torchrun_launcher,
)

WRITE_SUMMARY = ("import json, sys, pathlib; pathlib.Path(sys.argv[1], 'summary.json')"
                 ".write_text(json.dumps({'final_val_accuracy': 0.5, 'wan_bytes_total': 7}))")


def recording_launcher(code: str, seen: list):
    """Starts ``python -c code OUT``; records the geodml command the run would have had and what the run
    directory held at launch."""
    def launch(spec, stdout, stderr):
        seen.append({"cmd": torchrun_command(spec), "files": sorted(p.relative_to(spec.out).as_posix()
                                                                    for p in spec.out.rglob("*") if p.is_file())})
        return subprocess.Popen([sys.executable, "-c", code, str(spec.out)], stdout=stdout, stderr=stderr,
                                start_new_session=True)
    return launch


def interrupted(tmp_path, *, checkpoint: bool):
    """A run directory as a killed run leaves it: launch.json, partial metrics, output, maybe a checkpoint."""
    spec = RunSpec("r", tmp_path / "r", ("--algo", "fedavg", "--iter-local", "4"), 2)
    spec.out.mkdir(parents=True)
    (spec.out / "launch.json").write_text(json.dumps(launch_record(spec)))
    (spec.out / "metrics.jsonl").write_text('{"step": 5}\n')
    (spec.out / "stderr.txt").write_text("[rank0]: ValueError: from the first attempt\n")
    if checkpoint:
        (spec.out / "rank1").mkdir()
        (spec.out / "rank1" / "ckpt-00000004.pt").write_bytes(b"state")
        (spec.out / "rank1" / "ckpt-00000008.pt.tmp").write_bytes(b"half")
    return spec


@pytest.mark.integration
def test_interrupted_run_with_checkpoints_is_resumed_and_its_checkpoints_go_when_it_ends(tmp_path):
    spec, seen, log = interrupted(tmp_path, checkpoint=True), [], []
    res = run_all([spec], launcher=recording_launcher(WRITE_SUMMARY, seen), log=log.append, poll_s=0.02,
                  checkpoint_every=7)
    assert res[0].status == "ok"
    cmd = seen[0]["cmd"]
    assert cmd[cmd.index("--checkpoint-every") + 1] == "7" and "--resume" in cmd
    assert cmd[-2:] == ["--out", str(spec.out)]
    # nothing was cleared before the launch; once the run finished its checkpoints were deleted
    assert seen[0]["files"] == ["launch.json", "metrics.jsonl", "rank1/ckpt-00000004.pt", "rank1/ckpt-00000008.pt.tmp",
                                "stderr.txt", "stdout.txt"]
    assert not list(spec.out.rglob("ckpt-*")) and (spec.out / "metrics.jsonl").exists()
    err = (spec.out / "stderr.txt").read_text().splitlines()
    assert err[0] == "[rank0]: ValueError: from the first attempt"  # appended to, not overwritten
    assert err[1].startswith("--- geodml.study: resumed from the run's checkpoints at ")
    assert log[0] == "[1/1] resume r (study time 0.0 s) from its checkpoints"
    assert json.loads((spec.out / "launch.json").read_text()) == launch_record(spec)  # identity unchanged


@pytest.mark.integration
def test_a_resumed_runs_remainder_does_not_set_the_eta(tmp_path):
    spec, log = interrupted(tmp_path, checkpoint=True), []
    fresh = RunSpec("s", tmp_path / "s", ("--algo", "bsp"), 2)
    run_all([spec, fresh], launcher=recording_launcher(WRITE_SUMMARY, []), log=log.append, poll_s=0.02)
    done = [line for line in log if " done " in line]
    assert done[0].startswith("[1/2] done r in ") and " left" not in done[0]  # no ETA from a remainder
    assert done[1].startswith("[2/2] done s in ")


@pytest.mark.integration
def test_interrupted_run_without_checkpoints_starts_afresh(tmp_path):
    spec, seen, log = interrupted(tmp_path, checkpoint=False), [], []
    res = run_all([spec], launcher=recording_launcher(WRITE_SUMMARY, seen), log=log.append, poll_s=0.02,
                  checkpoint_every=7)
    assert res[0].status == "ok" and "--resume" not in seen[0]["cmd"] and "--checkpoint-every" in seen[0]["cmd"]
    assert seen[0]["files"] == ["launch.json", "stderr.txt", "stdout.txt"]  # the partial run was cleared
    assert (spec.out / "stderr.txt").read_text() == "" and log[0].startswith("[1/1] start r ")


@pytest.mark.integration
def test_a_failed_resume_names_its_own_cause_not_the_first_attempts(tmp_path):
    spec = interrupted(tmp_path, checkpoint=True)
    fail = "import sys; print('geodml: error: --out r holds checkpoints of rank1 that do not fit', file=sys.stderr); sys.exit(2)"
    res = run_all([spec], launcher=recording_launcher(fail, []), log=lambda m: None, poll_s=0.02)
    assert res[0].status == "failed"
    assert res[0].error == "exit code 2 (`geodml: error: --out r holds checkpoints of rank1 that do not fit`)"
    assert (spec.out / "rank1" / "ckpt-00000004.pt").exists()  # kept: a failed run is not finished


@pytest.mark.integration
def test_checkpoint_cadence_is_not_part_of_a_runs_identity(tmp_path):
    spec = RunSpec("r", tmp_path / "r", ("--algo", "bsp"), 2)
    run_all([spec], launcher=recording_launcher(WRITE_SUMMARY, []), log=lambda m: None, poll_s=0.02,
            checkpoint_every=3)
    again = run_all([spec], launcher=recording_launcher("raise SystemExit(9)", []), log=lambda m: None,
                    checkpoint_every=0)
    assert again[0].status == "reused"
    with pytest.raises(ValueError, match="checkpoint_every must be >= 0 steps"):
        run_all([spec], checkpoint_every=-1, log=lambda m: None)


@pytest.mark.parametrize("argv, nproc, processes, steps", [
    # FedAvg with sampling over hosted partitions runs on the pool engine: checkpoints would move it to threads
    (("--algo", "fedavg", "--iter-local", "4", "--client-fraction", "0.5"), 10, 1, 0),
    (("--algo", "fedavg", "--iter-local", "4"), 10, 0, AUTO_CHECKPOINT_STEPS),  # one process per partition
    (("--algo", "fedavg", "--local-epochs", "1", "--iwds", "0.9,0.1,0.5"), 10, 1, AUTO_CHECKPOINT_STEPS),  # threads
    (("--algo", "fedavg", "--iter-local", "4", "--engine", "threads"), 10, 2, AUTO_CHECKPOINT_STEPS),
    (("--algo", "gaia", "--checkpoint-every", "50"), 4, 0, 0),  # the study's own flag decides
    (("--no-such-flag",), 4, 0, 0),  # validate_spec reports it
])
def test_default_cadence_skips_the_pool_engine(argv, nproc, processes, steps):
    assert auto_checkpoint_every(RunSpec("r", "x", argv, nproc, processes=processes)) == steps


@pytest.mark.integration
def test_study_flag_reaches_the_runner_and_bad_values_exit_2(tmp_path, capsys):
    from geodml.study import iwds
    seen = []
    out = tmp_path / "study"
    argv = ["--budget", "quick", "--algos", "fedavg", "--settings", "lda-0.5", "--seeds", "0", "--out", str(out),
            "--only", "fedavg-uniform-lda-0.5-s0", "--checkpoint-every", "11"]
    assert iwds.main(argv, launcher=recording_launcher(WRITE_SUMMARY, seen)) == 0
    cmd = seen[0]["cmd"]
    assert cmd[cmd.index("--checkpoint-every") + 1] == "11"
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        iwds.main(["--checkpoint-every", "-1"])
    assert exc.value.code == 2
    assert "--checkpoint-every: expected a whole number of steps >= 0 (0: no checkpoints), got -1" in capsys.readouterr().err
    assert common.steps_or_zero("0") == 0


def test_dry_run_lists_a_resumable_run(tmp_path, capsys):
    specs = [interrupted(tmp_path / "a", checkpoint=True), interrupted(tmp_path / "b", checkpoint=False)]
    common.print_plan(specs)
    out = capsys.readouterr().out.splitlines()
    assert "0 running (another study process), 1 to resume from their checkpoints, 1 to run" in out[0]
    assert out[1].startswith("  resume   r: ") and out[2].startswith("  to run   r: ")


@pytest.mark.integration
def test_a_run_killed_mid_way_is_resumed_by_the_next_invocation_and_equals_an_uninterrupted_one(tmp_path, monkeypatch):
    """The study runner's real path: torchrun, 4 partitions hosted in one process (threads engine), FedAvg with
    one-epoch-style local work, client sampling and IWDS resampling on an LDA split, checkpoints every 20
    steps. The first invocation's process is SIGKILLed after step 110 (as when a session ends); the next
    invocation resumes it from step 100, and its weights, bytes, accuracy and metrics.jsonl equal an
    uninterrupted run's."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GEODML_FAULT"):
        monkeypatch.delenv(var, raising=False)
    argv = ("--algo", "fedavg", "--dataset", "digits", "--model", "mlp", "--partition", "lda", "--alpha", "0.5",
            "--batch-size", "8", "--lr", "0.05", "--rounds", "6", "--local-epochs", "0.5", "--client-fraction", "0.5",
            "--iwds", "0.9,0.1,0.5", "--iwds-mode", "resample", "--eval-every-rounds", "1", "--eval-every",
            "1000000000", "--wan", "virtual", "--seed", "0", "--no-progress")
    full = RunSpec("full", tmp_path / "full", argv, 4, processes=1)
    cut = RunSpec("cut", tmp_path / "cut", argv, 4, processes=1)
    logs: list[str] = []
    assert run_all([full], launcher=torchrun_launcher, log=logs.append, checkpoint_every=0, timeout_s=240)[0].succeeded
    monkeypatch.setenv("GEODML_FAULT", "rank=2,step=110,how=kill")
    first = run_all([cut], launcher=torchrun_launcher, log=logs.append, checkpoint_every=20, timeout_s=240)[0]
    assert first.status == "failed" and not (cut.out / "summary.json").exists()
    assert (cut.out / "rank0" / "ckpt-00000100.pt").exists()
    monkeypatch.delenv("GEODML_FAULT")
    second = run_all([cut], launcher=torchrun_launcher, log=logs.append, checkpoint_every=20, timeout_s=240)[0]
    assert second.status == "ok", second.error
    assert any(line.startswith("[1/1] resume cut ") for line in logs)
    assert "resumed from step 100" in (cut.out / "stdout.txt").read_text()
    sa, sb = (json.loads((s.out / "summary.json").read_text()) for s in (full, cut))
    assert sa["steps"] == sb["steps"] > 110
    for key in ("wan_bytes_total", "wan_bytes_by_kind", "wan_bytes_by_link", "messages_total", "final_val_accuracy",
                "per_rank_val_accuracy"):
        assert sa[key] == sb[key], key
    for f in ["model.pt", *(f"rank{k}/model.pt" for k in range(4))]:
        a, b = torch.load(full.out / f, weights_only=True), torch.load(cut.out / f, weights_only=True)
        assert all(torch.equal(a[n], b[n]) for n in a), f
    lines = [(s.out / "metrics.jsonl").read_text().splitlines() for s in (full, cut)]
    steps = [[json.loads(line)["step"] for line in ls] for ls in lines]
    assert steps[0] == steps[1]  # the redone steps 101-110 are not logged twice
    assert not list(cut.out.rglob("ckpt-*"))  # a finished run's checkpoints are deleted
