"""The study runner resumes a run cut short from its checkpoints (geodml.study.runner) instead of
starting it again: launched with ``--checkpoint-every`` (not part of the run's identity) and, after an
interruption, with ``--resume``; the result equals an uninterrupted run's bit for bit."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time

import pytest
import torch

from geodml.study import common, runner
from geodml.study.runner import (
    AUTO_CHECKPOINT_STEPS,
    RunSpec,
    auto_checkpoint_every,
    check_reusable,
    launch_record,
    resume_step,
    run_all,
    sources_digest,
    torchrun_command,
    torchrun_launcher,
    validate_spec,
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


def interrupted(tmp_path, *, checkpoint: bool, argv=("--algo", "fedavg", "--iter-local", "4")):
    """A run directory as a killed run leaves it: launch.json, partial metrics, output, maybe a checkpoint
    (stand-in bytes: tests that resume from it stub resume_step; the real files are the last test's)."""
    spec = RunSpec("r", tmp_path / "r", tuple(argv), 2)
    spec.out.mkdir(parents=True)
    (spec.out / "launch.json").write_text(json.dumps(launch_record(spec)))
    (spec.out / "metrics.jsonl").write_text('{"step": 5}\n')
    (spec.out / "stderr.txt").write_text("[rank0]: ValueError: from the first attempt\n")
    if checkpoint:
        (spec.out / "rank1").mkdir()
        (spec.out / "rank1" / "ckpt-00000004.pt").write_bytes(b"state")
        (spec.out / "rank1" / "ckpt-00000008.pt.tmp").write_bytes(b"half")
    return spec


@pytest.fixture
def resumable(monkeypatch):
    """resume_step finds step 4 in any directory with checkpoint files (they are stand-ins here)."""
    monkeypatch.setattr(runner, "resume_step", lambda spec: (4, "") if runner.has_checkpoints(spec.out) else (None, "x"))
    monkeypatch.setattr(common, "resume_step", runner.resume_step)


@pytest.mark.integration
def test_interrupted_run_with_checkpoints_is_resumed_and_its_checkpoints_go_when_it_ends(tmp_path, resumable):
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
    assert log[0] == "[1/1] resume r from step 4 of its checkpoints (study time 0.0 s)"
    assert json.loads((spec.out / "launch.json").read_text()) == launch_record(spec)  # identity unchanged


@pytest.mark.integration
def test_a_resumed_runs_remainder_does_not_set_the_eta(tmp_path, resumable):
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
    assert seen[0]["files"] == ["launch.json", "sources.json", "stderr.txt", "stdout.txt"]  # the partial run was cleared
    assert (spec.out / "stderr.txt").read_text() == ""
    assert log[0].endswith("; its interrupted attempt was cleared: it left no checkpoints")
    assert json.loads((spec.out / "sources.json").read_text()) == {"geodml_sources_sha256": sources_digest()}


def test_resume_step_says_why_a_directory_cannot_be_resumed(tmp_path, monkeypatch):
    spec = interrupted(tmp_path, checkpoint=False)
    assert resume_step(spec) == (None, "it left no checkpoints")
    (spec.out / "rank0").mkdir()
    (spec.out / "rank0" / "ckpt-00000010.pt.tmp").write_bytes(b"half")  # a write cut short is no checkpoint
    assert resume_step(spec) == (None, "it left no checkpoints")
    (spec.out / "rank0" / "ckpt-00000010.pt").write_bytes(b"not a checkpoint")
    assert resume_step(spec) == (None, "its directory has no sources.json naming the code it started with")
    (spec.out / "sources.json").write_text(json.dumps({"geodml_sources_sha256": "0" * 64}))
    assert resume_step(spec) == (None, "the geodml code changed since it started")
    (spec.out / "sources.json").write_text(json.dumps({"geodml_sources_sha256": sources_digest()}))
    step, why = resume_step(spec)
    assert step is None and why.startswith("its checkpoints cannot be resumed (") and "ckpt-00000010.pt" in why


def test_sources_digest_covers_the_training_code_not_the_launcher(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    for rel, text in {"geodml/trainer.py": "a = 1\n", "geodml/_kernels.c": "int x;\n",
                      "geodml/study/runner.py": "b = 2\n", "geodml/notes.md": "c\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    monkeypatch.setattr(runner, "REPO_ROOT", root)
    base = sources_digest()
    (root / "geodml/study/runner.py").write_text("b = 3\n")
    (root / "geodml/notes.md").write_text("d\n")
    assert sources_digest() == base  # the launcher and non-code files do not count
    (root / "geodml/trainer.py").write_text("a = 2\n")
    changed = sources_digest()  # read again: a checkout that changes under a running study is seen
    assert changed != base
    (root / "geodml/_kernels.c").write_text("int y;\n")
    assert sources_digest() != changed


@pytest.mark.integration
def test_a_failed_resume_names_its_own_cause_not_the_first_attempts(tmp_path, resumable):
    spec = interrupted(tmp_path, checkpoint=True)  # its stderr holds the first attempt's ValueError
    res = run_all([spec], launcher=recording_launcher("import sys; sys.exit(3)", []), log=lambda m: None, poll_s=0.02)
    assert res[0].status == "failed" and res[0].error == "exit code 3"  # no cause: this attempt printed none
    assert (spec.out / "rank1" / "ckpt-00000004.pt").exists()  # kept: a failed run is not finished


@pytest.mark.integration
def test_checkpoint_cadence_is_not_part_of_a_runs_identity(tmp_path):
    spec = RunSpec("r", tmp_path / "r", ("--algo", "bsp"), 2)
    run_all([spec], launcher=recording_launcher(WRITE_SUMMARY, []), log=lambda m: None, poll_s=0.02,
            checkpoint_every=3)
    for other in (dataclasses.replace(spec, checkpoint_every=0), dataclasses.replace(spec, checkpoint_every=50)):
        check_reusable(other)  # the launch.json written at cadence 3 is this run's at any cadence
        validate_spec(other)
    (spec.out / "rank0").mkdir()
    (spec.out / "rank0" / "ckpt-00000003.pt").write_bytes(b"left by a study process that died after the summary")
    again = run_all([spec], launcher=recording_launcher("raise SystemExit(9)", []), log=lambda m: None,
                    checkpoint_every=0)
    assert again[0].status == "reused"
    assert not (spec.out / "rank0" / "ckpt-00000003.pt").exists()  # a finished run's leftovers go when reused
    with pytest.raises(ValueError, match="checkpoint_every must be >= 0 steps"):
        run_all([spec], checkpoint_every=-1, log=lambda m: None)


@pytest.mark.parametrize("argv, nproc, processes, steps", [
    # every run checkpoints (one engine for every algorithm and process count)
    (("--algo", "fedavg", "--iter-local", "4", "--client-fraction", "0.5"), 10, 1, AUTO_CHECKPOINT_STEPS),
    (("--algo", "fedavg", "--iter-local", "4"), 10, 0, AUTO_CHECKPOINT_STEPS),  # one process per partition
    (("--algo", "fedavg", "--local-epochs", "1", "--iwds", "0.9,0.1,0.5"), 10, 1, AUTO_CHECKPOINT_STEPS),
    (("--algo", "gaia", "--checkpoint-every", "50"), 4, 0, 0),  # the study's own flag decides
    (("--no-such-flag",), 4, 0, 0),  # validate_spec reports it
])
def test_default_cadence_is_the_study_flags_or_auto(argv, nproc, processes, steps):
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


def test_an_interrupted_run_with_its_own_checkpoint_flag_passes_validation(tmp_path):
    """-- --checkpoint-every N is a run's own flag; its interrupted directory is the runner's to resume or clear,
    so the preflight does not refuse it for want of an --out (it did: the study could not go on)."""
    spec = interrupted(tmp_path, checkpoint=False, argv=("--algo", "gaia", "--checkpoint-every", "50"))
    validate_spec(spec)


@pytest.mark.integration
def test_a_run_still_going_after_its_study_process_died_is_waited_for(tmp_path, resumable):
    """A study process killed with SIGKILL leaves its run going (own session): the next invocation waits for
    the process that has the run's --out instead of resuming or clearing the directory under it."""
    spec = interrupted(tmp_path, checkpoint=True)
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)", "--out", str(spec.out)],
                              start_new_session=True)
    try:
        log: list[str] = []
        t0 = time.monotonic()
        res = run_all([spec], launcher=recording_launcher(WRITE_SUMMARY, []), log=log.append, poll_s=0.05,
                      timeout_s=60)
        assert orphan.poll() is not None and time.monotonic() - t0 >= 1.0  # launched only after it ended
    finally:
        orphan.kill()
        orphan.wait(10)
    assert log[0] == (f"[1/1] busy r: process(es) {orphan.pid} still run it outside any study process; waiting for "
                      "them (or stop them)")
    assert log[1].startswith("[1/1] resume r from step 4") and res[0].status == "ok"


def test_dry_run_lists_a_resumable_run(tmp_path, capsys, resumable):
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
    assert resume_step(cut) == (100, "")
    monkeypatch.delenv("GEODML_FAULT")
    second = run_all([cut], launcher=torchrun_launcher, log=logs.append, checkpoint_every=20, timeout_s=240)[0]
    assert second.status == "ok", second.error
    assert any(line.startswith("[1/1] resume cut from step 100 of its checkpoints (study time ") for line in logs)
    assert "resumed from step 100" in (cut.out / "stdout.txt").read_text()
    sa, sb = (json.loads((s.out / "summary.json").read_text()) for s in (full, cut))
    assert sa["steps"] == sb["steps"] > 110
    for key in ("wan_bytes_total", "wan_bytes_by_kind", "wan_bytes_by_link", "messages_total", "final_val_accuracy",
                "per_rank_val_accuracy"):
        assert sa[key] == sb[key], key
    for f in ["model.pt", *(f"rank{k}/model.pt" for k in range(4))]:
        a, b = torch.load(full.out / f, weights_only=True), torch.load(cut.out / f, weights_only=True)
        assert all(torch.equal(a[n], b[n]) for n in a), f
    timing = ("wall_s", "emulated_s")  # measured times: a resumed run's differ
    rows = [[{k: v for k, v in json.loads(line).items() if k not in timing}
             for line in (s.out / "metrics.jsonl").read_text().splitlines()] for s in (full, cut)]
    assert rows[0] == rows[1] and len(rows[0]) > 20  # every value of every line; the redone 101-110 once
    assert not list(cut.out.rglob("ckpt-*"))  # a finished run's checkpoints are deleted
