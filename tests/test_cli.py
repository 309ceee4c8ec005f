"""CLI: flags and TOML map onto RunConfig; bad input is one clear message and exit code 2."""

import pytest

from geodml.cli import UsageError, main, parse_config


def test_defaults_and_flags_map_onto_sections():
    cfg = parse_config(["--algo", "bsp", "--lr", "0.05", "--lr-milestones", "64,96", "--skew", "0.4",
                        "--partition", "label", "--norm", "group", "--wan", "off", "--seed", "7"])
    assert cfg.algo.algo == "bsp"
    assert cfg.optim.lr == 0.05 and cfg.optim.lr_milestones == (64.0, 96.0)
    assert cfg.data.partition == "label" and cfg.data.skew == 0.4
    assert cfg.model.norm == "group" and cfg.comm.wan == "off" and cfg.seed == 7
    assert cfg.optim.batch_size == 20 and cfg.threads == 1  # defaults from the dataclasses


def test_toml_supplies_defaults_flags_override(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('lr = 0.01\nepochs = 3\nlr-milestones = [1, 2]\npartition = "dirichlet"\nalpha = 0.1\n')
    cfg = parse_config(["--config", str(f), "--epochs", "5"])
    assert cfg.optim.lr == 0.01 and cfg.optim.epochs == 5 and cfg.optim.lr_milestones == (1, 2)
    assert cfg.data.partition == "dirichlet" and cfg.data.alpha == 0.1


BAD = [
    (["--lr", "-1"], "--lr must be > 0"),
    (["--lr", "abc"], "--lr"),
    (["--epochs", "0"], "--epochs must be > 0"),
    (["--batch-size", "0"], "--batch-size"),
    (["--skew", "1.5"], "--skew"),
    (["--alpha", "0"], "--alpha"),
    (["--momentum", "1.0"], "--momentum"),
    (["--weight-decay", "-0.1"], "--weight-decay"),
    (["--lr-milestones", "96,64"], "--lr-milestones must be strictly increasing"),
    (["--lr-milestones", "a,b"], "--lr-milestones"),
    (["--algo", "sgd"], "--algo"),
    (["--dataset", "imagenet"], "--dataset"),
    (["--model", "resnet20", "--norm", "none"], "--norm none is not available for --model resnet20"),
    (["--model", "mlp", "--norm", "batch"], "--norm batch is not available for --model mlp"),
    (["--eval-every", "0"], "--eval-every"),
    (["--threads", "0"], "--threads"),
    (["--seed", "-3"], "--seed"),
    (["--wan", "fast"], "--wan"),
    (["--wan-scale", "0"], "--wan-scale"),
    (["--config", "/nonexistent/run.toml"], "--config: file not found"),
    (["--bogus-flag"], "unrecognized arguments"),
]


@pytest.mark.parametrize("argv,needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_flags_raise_clear_error(argv, needle):
    with pytest.raises(ValueError) as exc:
        parse_config(argv)
    assert needle in str(exc.value)


def test_bad_toml_key_and_syntax(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("learning_rate = 0.1\n")
    with pytest.raises(UsageError, match="unknown key 'learning_rate'"):
        parse_config(["--config", str(f)])
    f.write_text("lr = = 1\n")
    with pytest.raises(UsageError, match="not valid TOML"):
        parse_config(["--config", str(f)])


def test_main_exit_code_2_one_message(capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert main(["--lr", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("geodml: error:") == 1 and "--lr must be > 0" in err and "Traceback" not in err


def test_main_silent_on_other_ranks(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "5")
    assert main(["--lr", "-1"]) == 2
    assert capsys.readouterr().err == ""


def test_torchrun_bad_flag_exit_2_message_printed_once():
    """Under torchrun every rank exits with 2 before any process group exists; only rank 0 speaks."""
    from tests.mp import run_torchrun
    r = run_torchrun(3, ["--lr", "-1", "--dataset", "digits"], timeout_s=120)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert out.count("geodml: error: --lr must be > 0") == 1
    assert "exitcode  : 2" in out and "Traceback (most recent call last)" not in out.split("geodml: error")[0]


def test_bad_topology_and_data_dir_rejected_before_start(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert main(["--topology", "no-such-topology"]) == 2
    err = capsys.readouterr().err
    assert err.count("geodml: error:") == 1 and "no-such-topology" in err
    assert main(["--dataset", "mnist", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("geodml: error:") == 1 and "train-images-idx3-ubyte" in err
    assert main(["--algo", "bsp", "--skewscout"]) == 2
    assert "--skewscout tunes a communication knob" in capsys.readouterr().err
