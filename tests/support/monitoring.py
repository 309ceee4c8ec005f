"""Monitoring helpers shared by the Prometheus and dashboard tests: the shipped Grafana dashboard and
Prometheus config, the expressions of the dashboard's panels, a small PromQL scanner, free port
ranges for exporters."""

from __future__ import annotations

import re
import socket

from tests.support.procs import REPO, free_port

DASHBOARD = REPO / "launch/grafana/provisioning/dashboards/geodml.json"
PROM_CONFIG = REPO / "launch/prometheus/prometheus.yml"
CUDA_ONLY = {"geodml_gpu_memory_allocated_bytes", "geodml_gpu_memory_reserved_bytes"}
"""Metrics only a CUDA run exports."""


def free_base(n: int) -> int:
    """A base port with ``n`` consecutive free ports on loopback."""
    for _ in range(50):
        base = free_port()
        if base + n > 65535:
            continue
        try:
            socks = []
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


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
