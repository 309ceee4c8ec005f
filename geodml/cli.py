"""Command line: flags (and an optional TOML file of defaults) -> RunConfig -> run.

Thin on purpose (docs/design.md style rule 10): parse, validate everything that can be validated
before a process group exists, then hand over to geodml.compose. Bad input prints one message
(on rank 0 only, so torchrun's K processes don't repeat it) and exits with code 2 on every
rank. Every flag, its type, choices, default and help come from the config dataclasses
(geodml.config.OPTIONS); this module only lays them out and maps the values back.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import signal
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Any, Callable, NoReturn

from geodml import __version__
from geodml.config import (
    OPTIONS,
    SECTIONS,
    Option,
    RunConfig,
    parse_floats,
    plugin_config_class,
    plugin_options,
    upgrade_config,
)


class UsageError(ValueError):
    """Bad command-line input; the message is shown as-is."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would print and exit on every rank
        raise UsageError(message + did_you_mean(message, self))


def _close(word: str, candidates: list[str]) -> str | None:
    """The nearest of ``candidates`` to ``word`` (difflib's ratio >= 0.6, config.did_you_mean's rule), or None."""
    found = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(message: str, parser: argparse.ArgumentParser) -> str:
    """``" (did you mean --steps?)"`` for argparse's messages about an unknown flag or an invalid choice
    (the nearest flag or choice by difflib's ratio, at least 0.6), else ``""``."""
    flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    if message.startswith("unrecognized arguments: "):
        hints = []
        for tok in message.removeprefix("unrecognized arguments: ").split():
            if tok.startswith("--"):
                near = _close(tok.partition("=")[0], flags)
                if near:
                    hints.append(f"{tok.partition('=')[0]} -> {near}")
        return f" (did you mean: {', '.join(hints)}?)" if hints else ""
    m = re.search(r"argument (\S+?)(?:/\S+)?: invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if m:
        choices = [c.strip(" '\"") for c in m.group(3).split(",")]
        near = _close(m.group(2), choices)
        return f" (did you mean {near}?)" if near else ""
    return ""


def _float_list(text: str) -> tuple[float, ...]:
    try:
        return parse_floats(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers like 64,96, got {text!r}") from None


OPTION_OF: dict[str, Option] = {o.dest: o for o in OPTIONS}
"""argparse destination (= TOML key with underscores) -> its option."""
HELP_ORDER = ("algo", "gaia", "dgc", "fedavg", "compression", "plugin", "skewscout", "data", "model", "optim", "comm", None,
              "reliability")
"""The order of --help's sections (RunConfig attributes; None: RunConfig's own fields)."""


def _shown_default(o: Option) -> str | None:
    if o.default_text is not None:
        return o.default_text
    if o.kind is bool or o.default is None or o.default == ():
        return None
    if isinstance(o.default, float):
        return f"{o.default:g}"
    if isinstance(o.default, tuple):
        return ",".join(f"{x:g}" for x in o.default)
    return str(o.default)


COMMON = ("algo", "partitions", "dataset", "partition", "skew", "alpha", "epochs", "steps", "lr", "topology", "wan",
          "out", "seed", "eval_every")
"""The options a first run needs, shown first in --help in this order (destinations)."""
TOPOLOGY_DIR = Path(__file__).resolve().parent.parent / "topologies"
"""geodml.comm.topology.TOPOLOGY_DIR, without importing geodml.comm (which imports torch): the shipped topologies."""
EPILOG = """examples:
  python -m geodml --algo gaia --lr 0.002 --partitions 5 --topology five-continents --dataset digits --epochs 10
  python -m geodml --algo fedavg --iter-local 20 --partition label --skew 1.0 --partitions 5 --out runs/fedavg
  torchrun --nproc_per_node=5 -m geodml --algo dgc --lr 0.002 --dataset fashion-mnist
  python -m geodml --config runs/fedavg --seed 1 --out runs/fedavg-s1      # run a run again, another seed
  python -m geodml.report runs/gaia runs/fedavg --target 0.9                # compare runs
docs: README.md (quickstart, terms), docs/run-directory.md (outputs), docs/wan.md (topologies)"""


def shipped_topologies() -> list[str]:
    """The names ``--topology`` takes without a path (topologies/NAME.toml)."""
    return sorted(p.stem for p in TOPOLOGY_DIR.glob("*.toml"))


def _help(o: Option) -> str:
    text = f"{'/'.join(o.algos)}: {o.help}" if o.algos else o.help
    if o.dest == "topology":
        text += f"; shipped: {', '.join(shipped_topologies())}"
    default = _shown_default(o)
    return (text if default is None else f"{text} (default {default})").replace("%", "%%")


def _add_kwargs(o: Option) -> dict[str, Any]:
    if o.kind is bool:
        return {"action": "store_false" if o.default else "store_true"}
    kw: dict[str, Any] = {"type": {int: int, float: float, tuple: _float_list}.get(o.kind)}
    if o.choices is not None:
        kw["choices"] = o.choices
    if o.metavar is not None:
        kw["metavar"] = o.metavar
    return kw


def build_parser(extra: tuple[Option, ...] = ()) -> argparse.ArgumentParser:
    """The parser of every option, and ``extra`` ones (a plugin algorithm's, :func:`plugin_of`)."""
    p = _Parser(prog="geodml", usage="python -m geodml [options]   or   torchrun --nproc_per_node=K -m geodml [options]",
                description="Emulate decentralized, geo-distributed training over non-IID data.\npython -m geodml "
                "--partitions P hosts P partitions on this machine; under torchrun each rank is one partition.",
                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter, argument_default=argparse.SUPPRESS)
    p.add_argument("--version", action="version", version=f"geodml {__version__}")
    common = p.add_argument_group("common options (the rest follow, by topic)")
    common.add_argument("--config", metavar="FILE",
                   help="defaults for the flags: a TOML file (flat keys that are flag names, or [section] tables "
                   "as in a run's config.json), or a run's config.json or run directory to run it again (its "
                   "--out and --resume are not carried over); flags override it")
    groups: dict[str, Any] = {}
    every = (*OPTIONS, *extra)
    for dest in COMMON:
        o = next(o for o in every if o.dest == dest)
        common.add_argument(o.flag, dest=o.dest, help=_help(o), **_add_kwargs(o))
    for o in sorted(every, key=lambda o: HELP_ORDER.index(o.section)):
        if o.dest in COMMON:
            continue
        if o.group not in groups:
            groups[o.group] = p.add_argument_group(o.group)
        groups[o.group].add_argument(o.flag, dest=o.dest, help=_help(o), **_add_kwargs(o))
    return p


def plugin_of(algo: str) -> tuple[Option, ...]:
    """The options of ``--algo algo`` beyond geodml's own: a plugin algorithm's ``Config`` fields
    (geodml.config.plugin_options); none for geodml's algorithms. ValueError for a plugin that cannot load."""
    cls = plugin_config_class(algo)
    return () if cls is None else plugin_options(algo, cls)


def _algo_of(argv: list[str], raw: dict[str, Any]) -> str:
    """The ``--algo`` a command line asks for before it is parsed (its options depend on it): the
    last ``--algo X`` / ``--algo=X``, else the config file's ``algo`` (``raw``, either form), else the default."""
    algo = None
    for i, tok in enumerate(argv):
        if tok == "--":
            break
        if tok == "--algo" and i + 1 < len(argv):
            algo = argv[i + 1]
        elif tok.startswith("--algo="):
            algo = tok.partition("=")[2]
    in_file = raw.get("algo")
    in_file = in_file.get("algo") if isinstance(in_file, dict) else in_file   # [algo] algo = ... (sectioned)
    if algo is None and isinstance(in_file, str):
        algo = in_file
    return algo if algo is not None else OPTION_OF["algo"].default


def _config_path(argv: list[str]) -> str | None:
    for i, tok in enumerate(argv):
        if tok == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if tok.startswith("--config="):
            return tok.partition("=")[2]
    return None


RUN_CONFIG = "config.json"
"""A run directory's resolved configuration (geodml.rundir.CONFIG), which ``--config`` also reads."""
NOT_RERUN = ("out", "resume")
"""Fields of a run's config.json that ``--config`` does not carry over: a re-run writes its own directory
(``--out`` as for any run) and starts afresh unless ``--resume`` is given."""


def read_config_file(path: str) -> tuple[dict[str, Any], bool]:
    """The settings of ``--config PATH``: a TOML file (flat keys, or the sectioned form of config.json), a
    run's ``config.json``, or a run directory holding one. Returns (the file's table, whether it is a run's
    config.json); UsageError naming the file for anything unreadable."""
    target = path
    if os.path.isdir(path):
        target = os.path.join(path, RUN_CONFIG)
        if not os.path.isfile(target):
            raise UsageError(f"--config: {path} is a directory without {RUN_CONFIG}; expected a TOML file, "
                             f"a run's {RUN_CONFIG} or its run directory")
    is_json = target.endswith(".json")
    try:
        with open(target, "rb") as f:
            raw = json.load(f) if is_json else tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"--config: file not found: {path}") from None
    except OSError as exc:
        raise UsageError(f"--config: cannot read {target}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"--config: {target} is not valid TOML: {exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--config: {target} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"--config: {target}: expected a table of settings")
    run_config = is_json and isinstance(raw.get("config"), dict)
    if is_json and not run_config:
        raise UsageError(f"--config: {target} is not a run's {RUN_CONFIG} (it has no \"config\" table)")
    return (raw["config"] if run_config else raw), run_config


def flatten_sections(raw: dict[str, Any], option_of: dict[str, Option], *, where: str,
                     only_changed: bool = False) -> dict[str, Any]:
    """A config table in either form -> ``{flag name: value}``. A key whose value is a table and that names a
    RunConfig section (``[comm]``, ``[optim]``, ...; ``plugin`` for a plugin's options) holds that section's
    fields, by field name (as config.json writes them) or flag name; every other key is a flag name, as
    before. ``only_changed``: keep only values other than the field's default (a run's config.json lists
    every field, and the ones it did not set should not count as given). Unknown keys raise UsageError."""
    by_field = {(o.section, o.name): o for o in option_of.values()}
    out: dict[str, Any] = {}
    raw = upgrade_config(raw)   # [algo] t0 = ..., as run directories before the split wrote it

    def put(o: Option, value: Any) -> None:
        if o.name in NOT_RERUN and only_changed:
            return
        if only_changed and (value == o.default or (isinstance(value, list) and tuple(value) == o.default)):
            return
        out[o.dest] = value

    for key, value in raw.items():
        section = str(key)
        if isinstance(value, dict) and (section in SECTIONS or section == "plugin"):
            for name, v in value.items():
                field = str(name).removeprefix("--").replace("-", "_")
                o = by_field.get((section, field)) or option_of.get(field)
                if o is None or o.section != section:
                    names = sorted({op.name for op in option_of.values() if op.section == section})
                    near = _close(field, names)
                    raise UsageError(f"--config: {where}: unknown key {name!r} in [{section}]"
                                     + (f" (did you mean {near}?)" if near else ""))
                put(o, v)
        elif only_changed:
            o = by_field.get((None, section))
            if o is None:
                continue   # a run's config.json: sections of no option (none today) and future fields
            put(o, value)
        else:
            out[key] = value
    return out


def _load_config(path: str, option_of: dict[str, Option] = OPTION_OF) -> dict[str, Any]:
    raw, run_config = read_config_file(path)
    flat = flatten_sections(raw, option_of, where=path, only_changed=run_config)
    nulls = [k for k, v in flat.items() if v is None]
    values = values_of({k: v for k, v in flat.items() if v is not None}, option_of,
                       unknown=f"--config: {path}: unknown key {{key!r}} "
                       "(keys are flag names such as lr, algo, lr-milestones, or [section] tables as in a run's "
                       "config.json)", wrong=f"--config {path}: {{exc}}")
    values.update({option_of[k].dest if k in option_of else k: None for k in nulls})
    return values


def values_of(raw: dict[str, Any], option_of: dict[str, Option], *, unknown: str, wrong: str) -> dict[str, Any]:
    """``{flag name: value}`` (a TOML file's, or a dict given to geodml.run) -> ``{dest: value}`` as the
    fields take them; UsageError from the templates ``unknown`` ({key}) and ``wrong`` ({exc})."""
    out = {}
    for key, value in raw.items():
        o = option_of.get(str(key).removeprefix("--").replace("-", "_"))
        if o is None:
            near = _close(str(key).removeprefix("--").replace("_", "-"), [d.replace("_", "-") for d in option_of])
            raise UsageError(unknown.format(key=key) + (f" (did you mean {near}?)" if near else ""))
        try:
            out[o.dest] = o.from_toml(key, list(value) if isinstance(value, tuple) else value)
        except ValueError as exc:
            raise UsageError(wrong.format(exc=exc)) from None
    return out


def ignored_settings(values: dict, algo: str, option_of: dict[str, Option] = OPTION_OF) -> list[str]:
    """Flags given that have no effect with ``algo`` (to warn about, not to fail; docs/design.md style rule 4).
    A plugin algorithm takes the options of the geodml algorithm it extends (geodml.config.plugin_family)."""
    from geodml.config import FEDAVG_BASE_FIELDS, plugin_family
    family = plugin_family(algo) if isinstance(algo, str) else None
    own_iter_local = hasattr(plugin_config_class(algo) if isinstance(algo, str) else None, "iter_local")

    def used(o: Option) -> bool:
        if o.name == "iter_local" and o.plugin_class is None and own_iter_local:
            return False          # the plugin's Config has its own (DiLoCo's --inner-steps)
        if not o.algos or algo in o.algos:
            return True
        if family is None or family == algo or family not in o.algos:
            return False
        return family != "fedavg" or o.name in FEDAVG_BASE_FIELDS   # a plugin gets plain FedAvg's, not the variants'
    return [o.flag for o in (option_of.get(d) for d in values) if o is not None and not used(o)]


def ignored_norm_settings(values: dict, norm: str) -> list[str]:
    """Flags given that have no effect with normalization ``norm`` (e.g. --gn-groups without --norm group)."""
    return [o.flag for o in (OPTION_OF.get(d) for d in values) if o is not None and o.norms and norm not in o.norms]


def parse_config(argv: list[str] | None = None, *, warn: Callable[[str], object] | None = None) -> RunConfig:
    """Flags (over TOML defaults) -> validated RunConfig. Raises ValueError on bad input."""
    args = list(sys.argv[1:] if argv is None else argv)
    path = _config_path(args)
    peek: dict[str, Any] = {}
    if path is not None:
        try:
            peek = read_config_file(path)[0]
        except UsageError:
            peek = {}   # _load_config reports the file's problem
    extra = plugin_of(_algo_of(args, peek))
    option_of = {**OPTION_OF, **{o.dest: o for o in extra}}
    ns = vars(build_parser(extra).parse_args(args))
    values = _load_config(ns.pop("config"), option_of) if "config" in ns else {}
    values.update(ns)
    return config_of(values, option_of, warn=warn)


def config_of(values: dict[str, Any], option_of: dict[str, Option], *,
              warn: Callable[[str], object] | None = None) -> RunConfig:
    """``{dest: value}`` (parsed flags over TOML values) -> validated RunConfig, warning through ``warn``
    about settings that do nothing. Raises ValueError on bad input."""
    algo = values.get("algo", OPTION_OF["algo"].default)
    ignored = ignored_settings(values, algo, option_of)
    if ignored and warn is not None:
        warn(f"geodml: warning: {', '.join(ignored)} has no effect with --algo {algo}")
    norm = values.get("norm", OPTION_OF["norm"].default)
    unused = ignored_norm_settings(values, norm)
    if unused and warn is not None:
        warn(f"geodml: warning: {', '.join(unused)} has no effect with --norm {norm}")
    if algo in ("gaia", "dgc") and "lr" not in values and warn is not None:
        warn(f"geodml: warning: --algo {algo} applies the sum of the partitions' updates: at the default --lr "
             f"{OPTION_OF['lr'].default} its step with K partitions is up to K times BSP's at that rate; give --lr "
             "explicitly (BSP's rate / K for the same step; README, 'Learning rate')")
    if values.get("rounds") is not None and "epochs" in values and warn is not None:
        warn("geodml: warning: --epochs has no effect with --rounds (the rounds set the training length)")
    kwargs: dict[str | None, dict[str, Any]] = {}
    plugin_class = None
    for dest, value in values.items():
        o = option_of[dest]
        kwargs.setdefault(o.section, {})[o.name] = value
        plugin_class = o.plugin_class or plugin_class
    sections = {name: cls(**kwargs.get(name, {})) for name, cls in SECTIONS.items()}
    plugin = plugin_class(**kwargs["plugin"]) if plugin_class is not None else None
    return RunConfig(**sections, **kwargs.get(None, {}), plugin=plugin)


def config_of_mapping(raw: dict[str, Any], *, warn: Callable[[str], object] | None = None) -> RunConfig:
    """A dict of flag names to values (``{"algo": "gaia", "lr-milestones": (8, 12)}``, as a TOML file
    holds them; geodml.run) -> validated RunConfig. Raises ValueError (UsageError) on bad input."""
    algo = raw.get("algo", OPTION_OF["algo"].default)
    extra = plugin_of(algo) if isinstance(algo, str) else ()
    option_of = {**OPTION_OF, **{o.dest: o for o in extra}}
    values = values_of(raw, option_of, unknown="unknown setting {key!r} (keys are flag names such as lr, algo, "
                       "lr-milestones)", wrong="{exc}")
    return config_of(values, option_of, warn=warn)


def _error(message: str) -> None:
    print(f"geodml: error: {message}", file=sys.stderr)
    if not message.startswith("cannot write "):   # a storage fault (geodml.errors.StorageError) is no flag's fault
        print("run 'python -m geodml --help' for the flags", file=sys.stderr)


# How long a rank other than 0 that found a bad input waits for its torchrun agent's SIGTERM.
# The agent stops every worker as soon as one exits, so a rank that left at once could stop
# rank 0 before rank 0 printed the message (CI saw this once on 2 loaded cores: exit 2 from
# rank 1, SIGTERM for rank 0, no message). Rank 0 exits right after printing, so the SIGTERM
# normally comes within a monitor interval (0.1 s); the wait ends there.
RANK0_GRACE_S = 20.0


def _bad_input_exit(message: str, is_rank0: bool, grace_s: float = RANK0_GRACE_S, agent_stop: Any = None) -> int:
    """Exit code 2 for a bad input, with the message printed once: by rank 0. A rank other than 0
    under a torchrun agent (TORCHELASTIC_RUN_ID) stays until the agent stops it, which happens
    once rank 0 has printed and exited; the SIGTERM then ends it with exit code 2 too. If no
    SIGTERM comes within the grace, rank 0 did not stop on this input (a check that only this
    rank failed), so this rank prints the message itself and exits 2. Without an agent no one
    stops the others, and the non-zero ranks exit at once, silent. ``agent_stop`` (geodml.peerwatch.AgentStop)
    learns that the agent's SIGTERM is no lost peer once the handler is in place (a SIGTERM it held back
    during the checks then comes again and finds it)."""
    from geodml.peerwatch import BAD_INPUT
    if is_rank0:
        if agent_stop is not None:
            agent_stop.enter(BAD_INPUT)
        _error(message)
        return 2
    if "TORCHELASTIC_RUN_ID" not in os.environ or threading.current_thread() is not threading.main_thread():
        return 2

    def stopped(signum: int, frame: object) -> None:
        raise SystemExit(2)

    previous = signal.signal(signal.SIGTERM, stopped)
    if agent_stop is not None:
        agent_stop.enter(BAD_INPUT)
    try:
        time.sleep(grace_s)
    finally:
        signal.signal(signal.SIGTERM, previous)
    _error(message)
    return 2


def main(argv: list[str] | None = None, *, spawn: bool = False) -> int:
    """Parse, preflight, run. Exit codes: 0 done (or a torchrun restart that finds the run already
    finished), 2 bad input (one ``geodml: error:`` line from rank 0, every rank exits 2), 3 a rank
    missing at start-up or lost later (geodml.peerwatch.PEER_LOST_EXIT). ``spawn`` (``python -m
    geodml``): outside torchrun, a run of several partitions starts ``--processes`` local ranks
    (geodml.engine.launcher) after its input passed the preflight, and returns their exit code."""
    from geodml.peerwatch import AgentStop
    from geodml.runtime import Env
    try:
        env = Env.from_environ()
    except ValueError as exc:  # a broken torchrun environment has no trustworthy rank 0: every process says it
        _error(str(exc))
        return 2
    # Under a torchrun agent, a SIGTERM from it says which peer was lost (geodml.peerwatch.AgentStop).
    agent_stop = AgentStop.install(env.rank, env.world_size, env.local_world_size) if env.under_torchrun else None
    try:
        return _main(argv, env, spawn=spawn, agent_stop=agent_stop)
    finally:
        if agent_stop is not None:
            agent_stop.close()


def _main(argv: list[str] | None, env: Any, *, spawn: bool, agent_stop: Any) -> int:
    from geodml.peerwatch import PEER_LOST_EXIT, say_once
    from geodml.rundir import RunFinished
    from geodml.runtime import StartupError

    def bad_input(message: str) -> int:   # rank 0 reports it; its agent's SIGTERM then is no loss
        return _bad_input_exit(message, is_rank0, agent_stop=agent_stop)

    is_rank0 = env.rank == 0
    warnings: list[str] = []
    try:
        cfg = parse_config(argv, warn=warnings.append if is_rank0 else None)
        if env.under_torchrun and cfg.processes is not None and cfg.processes != env.world_size:
            raise ValueError(f"--processes {cfg.processes}: torchrun started {env.world_size} process(es) "
                             f"(--nproc_per_node decides under torchrun); leave out --processes")
        processes = 1
        if spawn and not env.under_torchrun:
            from geodml.engine.launcher import default_processes, launch_mode
            processes = cfg.processes or default_processes(cfg.partitions or 1)
            if processes > 1:
                launch_mode()
        if processes == 1:
            for m in warnings:  # (the launched ranks' rank 0 prints them otherwise)
                print(m, file=sys.stderr)
        from geodml.preflight import preflight
        pre = preflight(cfg, env)  # every check that needs no process group; resolved once, handed on
        if processes == 1 and is_rank0:
            for m in pre.advice:
                print(m, file=sys.stderr)
    except RunFinished as done:
        if is_rank0:
            print(f"geodml: --out {done} already holds this run, finished (summary.json): nothing to do after the "
                  "torchrun restart", file=sys.stderr)
        return 0
    except ValueError as exc:
        return bad_input(str(exc))
    if processes > 1:
        from geodml.engine.launcher import spawn as spawn_ranks
        return spawn_ranks(sys.argv[1:] if argv is None else argv, processes, main)
    if agent_stop is not None:
        agent_stop.enter("at start-up")
    from geodml.compose import InputError, run  # (torch is imported after the flags: --help stays fast)
    from geodml.interrupt import Interrupted, on_signals
    try:
        with on_signals():
            run(cfg, env, pre)
    except Interrupted as stop:   # a signal, at a step every rank agreed on (geodml.interrupt)
        if is_rank0:
            print(interrupted_text(stop, list(sys.argv[1:] if argv is None else argv),
                                   under_torchrun=env.under_torchrun and "TORCHELASTIC_RUN_ID" in os.environ),
                  file=sys.stderr, flush=True)
        return stop.exit_code
    except InputError as exc:  # found during set-up, after the process group exists (docs/reliability.md)
        return bad_input(str(exc))
    except StartupError as exc:  # a rank never joined: name it, no traceback (one line per rank)
        say_once(f"geodml: error: {exc}; stopping rank {env.rank}")
        return PEER_LOST_EXIT
    return 0


def resume_command(argv: list[str], out: Any, *, under_torchrun: bool) -> str:
    """The command that continues an interrupted run: the same flags, ``--resume``, and ``--out`` if they
    did not name it (a default run directory is new on every start)."""
    import shlex
    args = [a for a in argv if a != "--resume"]
    if not any(a == "--out" or a.startswith("--out=") for a in args):
        args += ["--out", str(out)]
    line = " ".join(shlex.quote(a) for a in [*args, "--resume"])
    return (f"the same torchrun command with the flags {line}" if under_torchrun else f"python -m geodml {line}")


def interrupted_text(stop: Any, argv: list[str], *, under_torchrun: bool) -> str:
    """The CLI's lines for a run a signal ended: where it stopped, its checkpoint or that it has none, and
    how to resume it."""
    import signal as signals

    from geodml.checkpoint import list_steps
    out = stop.out
    steps = list_steps(out, 0) if out is not None else []
    head = f"geodml: interrupted ({signals.Signals(stop.signum).name}) at step {stop.step} of {stop.total_steps}; "
    if not steps or out is None:
        return head + ("no checkpoint: the run cannot be resumed (give --checkpoint-every N to make runs resumable); "
                       f"start it again with --restart in {out}, or with another --out")
    return (head + f"checkpoint at {out} (step {steps[-1]})\n"
            f"geodml: resume with: {resume_command(argv, out, under_torchrun=under_torchrun)}")


def entry() -> int:
    """The ``geodml`` console script: ``python -m geodml``."""
    return main(spawn=True)


if __name__ == "__main__":
    sys.exit(main(spawn=True))
