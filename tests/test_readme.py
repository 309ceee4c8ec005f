"""The README's quickstart runs as written: its commands are parsed out of README.md and executed (digits, in a
fresh directory), and the comparison they print matches the one the README shows: every cell but the emulated
seconds (measured compute time is part of them), accuracies within 0.01 (another CPU may differ in the last bits
of a float, and a few test predictions with them), the rest exactly."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from tests.support.procs import REPO, _env

README = (REPO / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def _cells(lines: list[str]) -> list[list[str]]:
    """A console table (header, dashes, rows) -> its rows' cells, cut where the dashes line's columns are."""
    spans = [m.span() for m in re.finditer(r"-+", lines[1])]
    return [[line[a:b if i + 1 < len(spans) else None].strip() for i, (a, b) in enumerate(spans)]
            for line in (lines[0], *lines[2:])]


def test_the_readme_starts_with_the_two_commands_and_stays_short():
    first = _blocks(README, "bash")[0].splitlines()
    assert [line.split()[0] for line in first] == ["launch/demo.sh", "launch/test.sh"]
    assert len(README.splitlines()) <= 260
    assert not re.search(r"\bissue \d+", README), "no development history in user-facing text"


@pytest.mark.integration
def test_quickstart_commands_print_the_table_the_readme_shows(tmp_path):
    section = _section("Quickstart")
    commands = [line for line in _blocks(section, "bash")[0].splitlines() if line.strip()]
    assert len(commands) == 3 and all(c.startswith(".venv/bin/python -m ") for c in commands)
    shown = _blocks(section, "text")[0].splitlines()
    out = ""
    for command in commands:
        argv = [sys.executable, *shlex.split(command)[1:]]
        r = subprocess.run(argv, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{command}\n{r.stderr[-3000:]}"
        assert "Traceback" not in r.stderr and "recvValue failed" not in r.stderr, r.stderr[-3000:]
        out = r.stdout
    printed = out.splitlines()
    start = printed.index(shown[0])
    want, got = _cells(shown[1:]), _cells(printed[start + 1:start + len(shown)])
    header = want[0]
    assert got[0] == header and len(got) == len(want)
    for w_row, g_row in zip(want[1:], got[1:]):
        for name, w, g in zip(header, w_row, g_row):
            if name.startswith("emulated s"):
                continue
            if re.fullmatch(r"0\.\d{4}", w):
                assert abs(float(g) - float(w)) <= 0.01, (name, w, g)
            else:
                assert g == w, (name, w, g)
