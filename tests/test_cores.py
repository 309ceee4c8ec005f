"""geodml.cores: the cores a process may run on, which sizes the trainer's step and evaluation slots and the
hsu studies' time estimates."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from geodml import cores


def test_usable_cores_counts_the_affinity_mask_not_the_machine(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 5}, raising=False)
    assert cores.usable_cores() == 2


def test_usable_cores_without_an_affinity_call_is_the_cpu_count(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # as on macOS and Windows
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert cores.usable_cores() == 16
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # "undetermined"
    assert cores.usable_cores() == 1


@pytest.mark.integration
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity call on this OS (Linux has one)")
def test_a_process_pinned_to_one_core_gets_one_step_and_evaluation_slot():
    code = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); import geodml.trainer as t; "
            "print(t._CORES, t._EVAL_SLOTS._value, t._STEP_SLOTS._value)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.split() == ["1", "1", "1"]
