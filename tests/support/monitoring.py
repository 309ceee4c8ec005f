"""Monitoring helpers shared by the Prometheus and dashboard tests: the shipped Grafana dashboard and
Prometheus config, the expressions of the dashboard's panels, a small PromQL scanner, free port
ranges for exporters."""

from __future__ import annotations

import os
import re

import pytest

from tests.support.procs import REPO

DASHBOARD = REPO / "launch/grafana/provisioning/dashboards/geodml.json"
PROM_CONFIG = REPO / "launch/prometheus/prometheus.yml"
CUDA_ONLY = {"geodml_gpu_memory_allocated_bytes", "geodml_gpu_memory_reserved_bytes"}
"""Metrics only a CUDA run exports."""


PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def promql_metrics_and_labels(expr: str) -> tuple[set[str], set[str]]:
    """Metric names and label names an expression uses (a small PromQL scanner)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    labels = {lab.strip() for g in GROUPING.findall(e) for lab in g.split(",") if lab.strip()}
    labels |= set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", " ".join(re.findall(r"\{([^}]*)\}", e))))
    e = GROUPING.sub(" ", e)
    e = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\$\{?\w+\}?", " ", e)
    names = {t for t, call in re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\()?", e)
             if not call and t not in PROMQL_WORDS}
    return names, labels


def dashboard_exprs(dash: dict) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


def east_west_topology(name: str, *, wan_mbps: float, latency_ms: float) -> str:
    """A two-region topology file for 3 ranks: ranks 0 and 1 share "east" (so the run also sends LAN
    bytes), rank 2 is "west"; a 10 Gbit/s LAN and the given WAN link."""
    return (f'name = "{name}"\nsource = "test fixture: illustrative numbers"\nregions = ["east", "west"]\n'
            f'placement = ["east", "east", "west"]\n[lan]\nbandwidth_mbps = 10000\nlatency_ms = 0.1\n'
            f"[default]\nbandwidth_mbps = {wan_mbps:g}\nlatency_ms = {latency_ms:g}\n")


def require(found: tuple[str | None, str], what: str) -> str:
    """The binary of a ``(binary or None, why)`` lookup, or skip the test saying why -- except in CI,
    where launch/test.sh installs the Debian packages these tests need: there a missing one is a
    failure, never a silent skip."""
    binary, why = found
    if binary is None:
        message = f"no {what}: {why}"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI: launch/test.sh should have installed it)")
        pytest.skip(message)
    return binary
