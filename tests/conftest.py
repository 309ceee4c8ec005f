"""Shared fixtures: no test may leave a child process behind (hivemind-style reaper)."""

import psutil
import pytest


@pytest.fixture(autouse=True)
def _kill_leftover_children():
    yield
    me = psutil.Process()
    children = me.children(recursive=True)
    for c in children:
        try:
            c.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(children, timeout=10)
