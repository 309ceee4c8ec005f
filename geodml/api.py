"""geodml as a library: ``geodml.run(config) -> RunResult``.

    import geodml
    result = geodml.run(["--algo", "gaia", "--partitions", "4", "--steps", "50"])
    result.summary["final_val_accuracy"], result.out, len(result.metrics)

``config`` is one of

* a list of command-line arguments, exactly as ``python -m geodml`` takes them;
* a dict of flag names to values, as a TOML ``--config`` file holds them (``{"algo": "gaia",
  "lr-milestones": (8, 12)}``; dashes or underscores; ``--`` optional);
* a :class:`geodml.RunConfig` (validated when it was built).

The run takes place in the calling process, which hosts every partition on the one engine
(geodml.engine), as ``python -m geodml --processes 1`` does; results do not depend on the process
count, so a run here equals the same run launched any other way. Bad input raises
:class:`InputError` whose message is the text the CLI prints after ``geodml: error:``; nothing is
started or written then. Warnings about settings that do nothing go through :mod:`warnings`
(category :class:`SettingWarning`). The run directory is ``config.out`` when set, else
``runs/<timestamp>-<algo>`` under the working directory, as on the command line.
"""

from __future__ import annotations

import copy
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from geodml.config import RunConfig
from geodml.engine.job import InputError

__all__ = ["InputError", "RunResult", "SettingWarning", "run"]


class SettingWarning(UserWarning):
    """A setting that has no effect with the others (the CLI's ``geodml: warning:`` lines)."""


@dataclass(frozen=True)
class RunResult:
    """What a finished run left in its directory (docs/design.md, the run-directory contract)."""

    out: Path
    """The run directory."""
    summary: dict[str, Any]
    """summary.json: final accuracies, bytes per kind and link, emulated seconds, ..."""
    metrics: list[dict[str, Any]]
    """metrics.jsonl, one dict per line (training, validation, SkewScout records)."""
    config: RunConfig
    """The validated configuration the run used (``out`` filled in)."""


def config_from(config: RunConfig | Mapping[str, Any] | Sequence[str]) -> RunConfig:
    """``config`` (any of the three forms) as a validated RunConfig; InputError on bad input. A
    RunConfig is copied, never changed."""
    from geodml.cli import UsageError, config_of_mapping, parse_config

    def warn(message: str) -> None:
        warnings.warn(message.removeprefix("geodml: warning: "), SettingWarning, stacklevel=4)

    try:
        if isinstance(config, RunConfig):
            return copy.deepcopy(config)
        if isinstance(config, Mapping):
            return config_of_mapping(dict(config), warn=warn)
        if isinstance(config, (str, bytes)) or not all(isinstance(a, str) for a in config):
            raise UsageError("geodml.run takes a RunConfig, a dict of flag names to values, or a list of "
                             f"command-line arguments (strings), got {type(config).__name__}")
        return parse_config(list(config), warn=warn)
    except InputError:
        raise
    except ValueError as exc:
        raise InputError(str(exc)) from None


def run(config: RunConfig | Mapping[str, Any] | Sequence[str]) -> RunResult:
    """Run one training job in this process and return its result (module docstring)."""
    from geodml.compose import run as run_job
    from geodml.preflight import preflight
    from geodml.rundir import METRICS, SUMMARY
    from geodml.runtime import Env, default_out_dir

    cfg = config_from(config)
    if cfg.processes not in (None, 1):
        raise InputError(f"--processes {cfg.processes}: geodml.run hosts every partition in the calling process; "
                         "leave out --processes (results do not depend on it), or launch python -m geodml")
    if cfg.out is None:
        cfg.out = default_out_dir(cfg.algo.algo)
    env = Env(0, 1, 0, 1, False)
    try:
        pre = preflight(cfg, env)
    except InputError:
        raise
    except ValueError as exc:
        raise InputError(str(exc)) from None
    for message in pre.advice:
        warnings.warn(message.removeprefix("geodml: warning: "), SettingWarning, stacklevel=2)
    run_job(cfg, env, pre)
    out = Path(cfg.out)
    summary = json.loads((out / SUMMARY).read_text())
    with open(out / METRICS) as f:
        metrics = [json.loads(line) for line in f if line.strip()]
    return RunResult(out=out, summary=summary, metrics=metrics, config=cfg)
