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
    (["--alpha", "-1"], "--alpha must be >= 0"),
    (["--client-size", "0"], "--client-size must be an integer >= 1"),
    (["--client-size", "1.5"], "--client-size"),
    (["--tail", "1.5"], "--tail must be a fraction in [0, 1]"),
    (["--tail", "nan"], "--tail must be a fraction in [0, 1]"),
    (["--entropy-steps", "-1"], "--entropy-steps must be an integer >= 0"),
    (["--partition", "zipf"], "--partition"),
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
    for var, value in (("RANK", "3"), ("WORLD_SIZE", "5"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(var, value)  # what torchrun sets; a partial set is its own error (test_bad_input.py)
    assert main(["--lr", "-1"]) == 2
    assert capsys.readouterr().err == ""


@pytest.mark.integration
def test_torchrun_bad_flag_exit_2_message_printed_once():
    """Under torchrun every rank exits with 2 before any process group exists; only rank 0 speaks."""
    from tests.support.procs import run_torchrun
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


# ---- TOML values must have the field's type (the types come from the config dataclasses) ----

def _toml(tmp_path, text):
    f = tmp_path / "run.toml"
    f.write_text(text)
    return f


TOML_WRONG_TYPE = [
    ('fedir = "false"\n', 'fedir = "false" is a string; expected a boolean (true/false)'),
    ("skewscout = 1\n", "skewscout = 1 is an integer; expected a boolean (true/false)"),
    ("steps = true\n", "steps = true is a boolean; expected an integer"),
    ("batch-size = 20.0\n", "batch-size = 20.0 is a float; expected an integer"),
    ("out = 5\n", "out = 5 is an integer; expected a string"),
    ("algo = [\"gaia\"]\n", 'algo = ["gaia"] is an array; expected a string'),
    ("lr = true\n", "lr = true is a boolean; expected a number"),
    ('lr-milestones = ["a", "b"]\n', 'lr-milestones = ["a", "b"] is an array holding a string ("a"); expected an array '
     'of numbers such as [64, 96] (or a string "64,96")'),
    ("lr-milestones = [1, true]\n", "lr-milestones = [1, true] is an array holding a boolean (true)"),
    ('iwds = "0.9,x"\n', 'iwds = "0.9,x" is a string that is not comma-separated numbers; expected an array'),
    ("iwds = 0.5\n", "iwds = 0.5 is a float; expected an array of numbers"),
    ("seed = {a = 1}\n", "seed = {a = 1} is a table; expected an integer"),
]


@pytest.mark.parametrize("text,message", TOML_WRONG_TYPE, ids=[t.strip() for t, _ in TOML_WRONG_TYPE])
def test_toml_value_of_the_wrong_type_names_key_value_and_type(tmp_path, text, message):
    f = _toml(tmp_path, text)
    with pytest.raises(UsageError) as exc:
        parse_config(["--config", str(f)])
    assert str(exc.value).startswith(f"--config {f}: {message}"), str(exc.value)


def test_toml_wrong_type_also_says_what_the_field_accepts(tmp_path):
    """After the type, the field's own check (config.py, the one validator) on the value, when it has one."""
    f = _toml(tmp_path, 'lr = "fast"\n')
    with pytest.raises(UsageError) as exc:
        parse_config(["--config", str(f)])
    assert str(exc.value) == (f"--config {f}: lr = \"fast\" is a string; expected a number "
                              "(--lr must be > 0, got 'fast')")
    f = _toml(tmp_path, "checkpoint-every = 2.5\n")
    with pytest.raises(UsageError, match=r"is a float; expected an integer \(--checkpoint-every must be an integer"):
        parse_config(["--config", str(f)])
    f = _toml(tmp_path, 'fedir = "false"\n')  # AlgoConfig has no objection to the string: the type error alone
    with pytest.raises(UsageError) as exc:
        parse_config(["--config", str(f)])
    assert str(exc.value) == f'--config {f}: fedir = "false" is a string; expected a boolean (true/false)'


def test_toml_wrong_type_through_main_is_one_message(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    f = _toml(tmp_path, "steps = true\n")
    assert main(["--config", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("geodml: error:") == 1 and "steps = true is a boolean; expected an integer" in err
    assert "Traceback" not in err


def test_config_that_is_a_directory_without_a_run_is_one_clear_error(tmp_path, capsys, monkeypatch):
    message = (f"--config: {tmp_path} is a directory without config.json; expected a TOML file, a run's "
               "config.json or its run directory")
    with pytest.raises(UsageError) as exc:
        parse_config(["--config", str(tmp_path)])
    assert str(exc.value) == message
    monkeypatch.delenv("RANK", raising=False)
    assert main(["--config", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0] == f"geodml: error: {message}"
    assert "Traceback" not in err


def test_toml_unknown_keys_stay_an_error(tmp_path):
    for text, key in (("no-progress = true\n", "no-progress"), ("[data]\nskew_s = 0.5\n", "skew_s"),
                      ("config = \"x.toml\"\n", "config"), ("timeout_s = 5\n", "timeout_s"),
                      ("[comm]\nlr = 0.1\n", "lr")):   # a flag of another section is no key of [comm]
        with pytest.raises(UsageError, match=f"unknown key '{key}'"):
            parse_config(["--config", str(_toml(tmp_path, text))])
    with pytest.raises(UsageError, match=r"unknown key 'skew_s' in \[data\] \(did you mean skew\?\)"):
        parse_config(["--config", str(_toml(tmp_path, "[data]\nskew_s = 0.5\n"))])


def test_toml_in_the_sections_of_config_json(tmp_path):
    """[section] tables hold fields by their config.json names (comm.timeout_s) or flag names; flat keys may sit
    beside them; the result equals the flat form's, and flags still override."""
    sectioned = _toml(tmp_path, 'seed = 3\n[algo]\nalgo = "gaia"\nt0 = 0.05\n[optim]\nlr = 0.002\n'
                      'lr_milestones = [8, 12]\n[data]\npartition = "label"\nskew = 0.8\n'
                      '[comm]\ntimeout_s = 30.0\nwan-scale = 2.0\n[skewscout]\nenabled = true\n')
    flat = tmp_path / "flat.toml"
    flat.write_text('seed = 3\nalgo = "gaia"\nt0 = 0.05\nlr = 0.002\nlr-milestones = [8, 12]\npartition = "label"\n'
                    'skew = 0.8\ncomm-timeout = 30.0\nwan-scale = 2.0\nskewscout = true\n')
    a, b = parse_config(["--config", str(sectioned)]), parse_config(["--config", str(flat)])
    assert a.to_dict() == b.to_dict()
    assert a.algo.algo == "gaia" and a.gaia.t0 == 0.05 and a.comm.timeout_s == 30.0 and a.comm.wan_scale == 2.0
    assert a.skewscout.enabled is True and a.optim.lr_milestones == (8, 12) and a.seed == 3
    assert parse_config(["--config", str(sectioned), "--t0", "0.2"]).gaia.t0 == 0.2


def test_each_algorithm_has_a_section_of_its_own_and_the_old_algo_table_still_reads(tmp_path, capsys):
    """Issue 66 item 7: Gaia's, DGC's, FedAvg's (with its variants') and the compressors' options are
    sections of their own (cfg.gaia.t0, cfg.fedavg.iter_local, ...), each option where its ``algos``
    metadata says; ``[gaia] t0`` and the ``[algo] t0`` of run directories before the split read the
    same; --help still titles each group by its algorithm."""
    from geodml.config import ALGO_SECTIONS, OPTIONS, SECTIONS
    assert list(SECTIONS)[3:8] == ["algo", *ALGO_SECTIONS]
    where = {o.name: o.section for o in OPTIONS}
    assert [o.name for o in OPTIONS if o.section == "algo"] == ["algo"]
    assert where["t0"] == "gaia" and where["sparsity"] == where["dgc_scope"] == "dgc"
    assert where["iter_local"] == where["server_optimizer"] == where["iwds"] == where["rounds"] == "fedavg"
    assert where["compress"] == where["compress_rank"] == "compression"
    for o in OPTIONS:   # the sections follow the algos metadata
        if o.section in ("gaia", "dgc", "fedavg"):
            assert o.algos == (o.section,), o
    new = _toml(tmp_path, '[algo]\nalgo = "fedavg"\n[fedavg]\niter_local = 7\nfedir = true\n[compression]\ncompress = "int8"\n')
    old = tmp_path / "old.toml"
    old.write_text('[algo]\nalgo = "fedavg"\niter_local = 7\nfedir = true\ncompress = "int8"\n')
    a, b = parse_config(["--config", str(new)]), parse_config(["--config", str(old)])
    assert a.to_dict() == b.to_dict() and a.fedavg.iter_local == 7 and a.fedavg.fedir and a.compression.compress == "int8"
    with pytest.raises(ValueError, match=r"--iter-local must be an integer >= 1, got 0"):
        parse_config(["--algo", "fedavg", "--iter-local", "0"])
    with pytest.raises(ValueError, match=r"--compress int8: compresses BSP's gradients or FedAvg's upload; --algo gaia"):
        parse_config(["--algo", "gaia", "--compress", "int8"])
    from geodml.cli import main
    with pytest.raises(SystemExit):
        main(["--algo", "fedavg", "--help"])
    text = capsys.readouterr().out
    assert "algorithm fedavg:" in text and "--iter-local" in text.split("algorithm fedavg:")[1]


def test_a_runs_config_json_reads_back_to_its_config(tmp_path):
    """Every committed study record's config.json (written by older code too) gives back the RunConfig it was
    written from, but for --out and --resume (a re-run writes its own directory, afresh) and fields added since
    (their defaults)."""
    import json
    from pathlib import Path

    from geodml.config import RunConfig, upgrade_config
    records = sorted(Path(__file__).resolve().parents[1].glob("docs/study/records/*/*/config.json"))
    assert len(records) >= 16
    default = RunConfig().to_dict()
    for f in records:
        written = upgrade_config(json.loads(f.read_text())["config"])  # older ones: [algo] held every algorithm's
        back = parse_config(["--config", str(f)]).to_dict()
        assert back["out"] is None
        for key, value in written.items():
            if key in back and key != "out":
                expect = {**default[key], **value} if isinstance(value, dict) else value
                if key == "reliability":
                    expect["resume"] = False   # a re-run starts afresh unless --resume is given
                assert json.dumps(back[key], sort_keys=True) == json.dumps(expect, sort_keys=True), (f, key)
        assert parse_config(["--config", str(f.parent)]).to_dict() == back   # the run directory itself


def test_config_json_of_a_run_reruns_it(tmp_path):
    """``--config RUN/config.json --out NEW`` repeats the run: the same resolved config (but --out) and the same
    final weights, bytes and accuracy; a JSON file that is no run's config.json is one clear error."""
    import json

    import torch
    first = tmp_path / "first"
    assert main(["--algo", "gaia", "--t0", "0.05", "--lr", "0.01", "--dataset", "digits", "--partitions", "3",
                 "--steps", "12", "--eval-every", "6", "--seed", "4", "--no-progress", "--out", str(first)]) == 0
    again = tmp_path / "again"
    assert main(["--config", str(first / "config.json"), "--out", str(again)]) == 0
    c1, c2 = (json.loads((d / "config.json").read_text())["config"] for d in (first, again))
    assert {**c1, "out": None} == {**c2, "out": None}
    s1, s2 = (json.loads((d / "summary.json").read_text()) for d in (first, again))
    assert s1["wan_bytes_by_link"] == s2["wan_bytes_by_link"] and s1["final_val_accuracy"] == s2["final_val_accuracy"]
    m1, m2 = (torch.load(d / "model.pt", weights_only=True) for d in (first, again))
    assert m1.keys() == m2.keys() and all(torch.equal(m1[k], m2[k]) for k in m1)
    other = tmp_path / "other.json"
    other.write_text('{"lr": 0.1}')
    with pytest.raises(UsageError, match='is not a run\'s config.json \\(it has no "config" table\\)'):
        parse_config(["--config", str(other)])


def test_valid_toml_of_every_kind_still_works(tmp_path):
    f = _toml(tmp_path, 'algo = "fedavg"\nfedir = true\nreset_momentum = false\nskewscout = true\nprogress = false\n'
                        'steps = 3\niter-local = 4\ncomm-timeout = 5\nlr = 1\nlr-milestones = [10, 20.5]\n'
                        'out = "runs/x"\ndata-cache = "off"\nclip-norm = 2.5\nmetrics_linger = 0\n'
                        'skewscout-search = "annealing"\nwire-auth = "off"\n')
    cfg = parse_config(["--config", str(f)])
    assert cfg.algo.algo == "fedavg" and cfg.fedavg.fedir is True and cfg.fedavg.reset_momentum is False
    assert cfg.skewscout.enabled is True and cfg.skewscout.search == "annealing" and cfg.progress is False
    assert cfg.optim.steps == 3 and cfg.fedavg.iter_local == 4 and cfg.comm.timeout_s == 5 and cfg.optim.lr == 1
    assert cfg.optim.lr_milestones == (10, 20.5) and cfg.out == "runs/x" and cfg.data.cache == "off"
    assert cfg.dgc.clip_norm == 2.5 and cfg.metrics_linger_s == 0 and cfg.comm.wire_auth == "off"
    f = _toml(tmp_path, 'algo = "fedavg"\niwds = "0.9, 0.1, 0.5"\nlr-milestones = "64,96"\n')  # as on the command line
    cfg = parse_config(["--config", str(f)])
    assert cfg.fedavg.iwds == (0.9, 0.1, 0.5) and cfg.optim.lr_milestones == (64.0, 96.0)
    f = _toml(tmp_path, 'algo = "fedavg"\niwds = [0.9, 0, 1]\nlr-milestones = []\n')
    cfg = parse_config(["--config", str(f), "--no-progress"])
    assert cfg.fedavg.iwds == (0.9, 0, 1) and cfg.optim.lr_milestones == () and cfg.progress is False


# ---- the CLI is derived from the config dataclasses ----

def test_every_config_field_is_a_flag_with_its_default_and_help():
    import dataclasses

    from geodml.cli import build_parser
    from geodml.config import OPTIONS, SECTIONS, RunConfig
    fields = {(s, f.name) for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    fields |= {(None, f.name) for f in dataclasses.fields(RunConfig) if f.name not in SECTIONS}
    fields -= {(None, "plugin")}  # a plugin algorithm's options object: its own fields are flags (tests/test_plugins.py)
    assert {(o.section, o.name) for o in OPTIONS} == fields
    assert len({o.flag for o in OPTIONS}) == len({o.dest for o in OPTIONS}) == len(OPTIONS)
    text = " ".join(build_parser().format_help().split())
    for o in OPTIONS:
        assert o.flag in text and o.help.split(";")[0].split("(")[0].strip() in text, o.flag
    for group in ("common options (the rest follow, by topic):", "SkewScout (Quagmire section 7):", "data:", "model:",
                  "optimization:",
                  "WAN and communication:", "run:", "metrics:", "reliability (docs/reliability.md):"):
        assert group in text
    assert "--lr LR initial learning rate eta_0 (default 0.02)" in text
    assert "--t0 T0 gaia: initial significance threshold" in text and "--iter-local ITER_LOCAL fedavg:" in text
    assert "--wan {off,virtual,real}" in text and "--comm-timeout COMM_TIMEOUT" in text


def test_flag_types_switches_and_lists():
    assert parse_config(["--fedir"]).fedavg.fedir is True
    cfg = parse_config(["--reset-momentum", "--server-nesterov", "--skewscout", "--algo", "fedavg",
                        "--resume", "--out", "x", "--no-progress", "--iwds", "0.9,0.1,0.5", "--steps", "7",
                        "--comm-timeout", "3", "--metrics-linger", "1.5", "--data-cache", "off",
                        "--skewscout-search", "stochastic"])
    a = cfg.fedavg
    assert a.reset_momentum and a.server_nesterov and cfg.skewscout.enabled and cfg.reliability.resume
    assert cfg.progress is False and a.iwds == (0.9, 0.1, 0.5) and cfg.optim.steps == 7
    assert cfg.comm.timeout_s == 3.0 and isinstance(cfg.comm.timeout_s, float) and cfg.metrics_linger_s == 1.5
    assert cfg.data.cache == "off" and cfg.skewscout.search == "stochastic"
    with pytest.raises(UsageError, match="--steps: invalid int value: '2.5'"):
        parse_config(["--steps", "2.5"])
    with pytest.raises(UsageError, match="--wire-auth: invalid choice"):
        parse_config(["--wire-auth", "maybe"])
    with pytest.raises(UsageError, match="expected comma-separated numbers like 64,96, got 'a,b'"):
        parse_config(["--iwds", "a,b"])


def test_warns_about_options_the_algorithm_ignores(tmp_path):
    said: list[str] = []
    parse_config(["--t0", "0.2", "--iter-local", "5", "--lr", "0.1"], warn=said.append)
    assert said == ["geodml: warning: --t0, --iter-local has no effect with --algo bsp"]
    said.clear()
    parse_config(["--config", str(_toml(tmp_path, "sparsity = 0.99\n")), "--algo", "gaia", "--t0", "0.2", "--lr",
                  "0.004"], warn=said.append)
    assert said == ["geodml: warning: --sparsity has no effect with --algo gaia"]
    said.clear()
    parse_config(["--algo", "dgc", "--sparsity", "0.99", "--clip-norm", "1", "--lr", "0.004"], warn=said.append)
    assert said == []
    cfg = parse_config(["--algo", "fedavg", "--epochs", "5", "--rounds", "3"], warn=said.append)
    assert said == ["geodml: warning: --epochs has no effect with --rounds (the rounds set the training length)"]
    assert cfg.fedavg.rounds == 3
    said.clear()
    parse_config(["--config", str(_toml(tmp_path, "epochs = 5\n")), "--algo", "fedavg", "--rounds", "3"],
                 warn=said.append)
    assert len(said) == 1
    said.clear()
    parse_config(["--algo", "fedavg", "--rounds", "3"], warn=said.append)   # the default --epochs: no warning
    parse_config(["--algo", "fedavg", "--epochs", "5"], warn=said.append)
    assert said == []


def test_registries_are_defined_once_and_agree():
    """config.py holds the names; the implementations must cover exactly those (no second list to drift)."""
    from geodml.algorithms import REGISTRY, algorithm_factory
    from geodml.config import ALGOS, KNOB_ALGOS, OPTIONS
    assert set(REGISTRY) == set(ALGOS)
    assert set(KNOB_ALGOS) == {name for name in ALGOS if algorithm_factory(name).KNOB is not None}
    assert all(set(o.algos) <= set(ALGOS) for o in OPTIONS)


def test_help_groups_each_algorithms_options_under_it():
    from geodml.cli import build_parser
    text = build_parser().format_help()
    sections = {}
    current = None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1]
            sections[current] = []
        elif current and line.strip().startswith("--"):
            sections[current].append(line.split()[0])
    assert "--t0" in sections["algorithm gaia"] and "--sparsity" in sections["algorithm dgc"]
    assert "--iter-local" in sections["algorithm fedavg"] and "--prox-mu" in sections["algorithm fedavg"]
    # what a first run needs comes first, in one group, and nowhere else
    first = next(name for name in sections if name != "options")
    assert first.startswith("common options") and sections[first][:3] == ["--config", "--algo", "--partitions"]
    assert {"--topology", "--out", "--steps", "--lr"} <= set(sections[first]) and "algorithm" not in sections
    assert sum(flags.count("--topology") for flags in sections.values()) == 1


def test_help_lists_the_shipped_topologies_and_ends_with_examples():
    from geodml.cli import TOPOLOGY_DIR, build_parser, shipped_topologies
    from geodml.comm.topology import TOPOLOGY_DIR as LOOKED_UP
    assert TOPOLOGY_DIR == LOOKED_UP and "five-continents" in shipped_topologies()
    text = build_parser().format_help()
    assert "shipped: " + ", ".join(shipped_topologies()) in " ".join(text.split()).replace("- ", "-")
    examples = text[text.index("\nexamples:\n"):].splitlines()[2:]
    commands = [line.split("#")[0].split() for line in examples if line.startswith("  python -m geodml --")]
    assert len(commands) >= 3
    for argv in commands:   # every example's flags parse (but --config's, which names a run made before)
        if "--config" not in argv:
            parse_config(argv[3:])


@pytest.mark.parametrize(("argv", "hint"), [
    (["--stepz", "3"], " (did you mean: --stepz -> --steps?)"),
    (["--stepz=3", "--lrr", "1"], " (did you mean: --stepz -> --steps, --lrr -> --lr?)"),
    (["--wan", "virtul"], " (did you mean virtual?)"),
    (["--algo", "gaai"], " (did you mean gaia?)"),
    (["--partition", "labl"], " (did you mean label?)"),
    (["--model", "lenat"], " (did you mean lenet?)"),
])
def test_did_you_mean(argv, hint):
    with pytest.raises(ValueError) as err:
        parse_config(argv)
    assert str(err.value).endswith(hint)


def test_did_you_mean_for_toml_keys_and_nothing_when_nothing_is_close(tmp_path):
    with pytest.raises(UsageError, match=r"unknown key 'lr_milestone' .* \(did you mean lr-milestones\?\)$"):
        parse_config(["--config", str(_toml(tmp_path, "lr_milestone = [1]\n"))])
    with pytest.raises(UsageError) as err:
        parse_config(["--zzzzqqq", "1"])
    assert "did you mean" not in str(err.value)


@pytest.mark.integration
def test_help_does_not_import_torch():
    """--help is the flag reference; it must not pay for torch (about 1.5 s): a fresh interpreter checks."""
    import subprocess
    import sys
    code = ("import sys\nfrom geodml.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip().endswith("False"), r.stderr[-500:]
