"""Shared fixtures.

* No test may leave a child process behind (hivemind-style reaper).
* ``GEODML_PROCESSES=1``: a ``python -m geodml`` the tests start runs in one process unless the test
  sets ``--processes`` (tests/test_launcher.py runs the default).
* The suite is split in two: unit tests run in this process; tests marked ``integration``
  start OS processes (torchrun, worker processes, the CLI, Prometheus). ``pytest -m "not
  integration"`` runs the unit tests alone in seconds. The split is enforced: an unmarked test
  that starts a process fails, naming the marker.
"""

import os
import subprocess

import psutil
import pytest

# `python -m geodml` outside torchrun starts one process per core by default (geodml.engine.launcher);
# the suite's runs take one process unless a test asks for more (results do not depend on it)
os.environ.setdefault("GEODML_PROCESSES", "1")

_RealPopen = subprocess.Popen


class _UnitTestPopen(_RealPopen):  # type: ignore[type-arg,misc]
    def __init__(self, *args, **kwargs):
        raise AssertionError("this test starts an OS process: mark it @pytest.mark.integration "
                             "(or pytestmark = pytest.mark.integration for the module); tests/conftest.py")


def pytest_sessionstart(session):
    """matplotlib's first import on a machine builds its font cache by running fc-list: do it here, so
    that a unit test plotting a study report does not trip the guard below on a fresh machine."""
    try:
        import matplotlib.font_manager  # noqa: F401
    except ImportError:  # the plots are optional (the studies skip them without matplotlib)
        pass


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before any fixture of the test is set up (module-scoped ones included): an unmarked test may
    not start a process."""
    if item.get_closest_marker("integration") is None:
        subprocess.Popen = _UnitTestPopen


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    subprocess.Popen = _RealPopen


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
