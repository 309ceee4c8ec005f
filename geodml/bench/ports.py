"""Free loopback ports for processes started later (torchrun's MASTER_PORT, a server a test or benchmark
starts): drawn outside the kernel's ephemeral range, so that no outgoing connection takes the port between the
check here and that process's bind. The benchmarks' and the tests' (tests/support/procs.py) picker."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_port(avoid: tuple[int, ...] = ()) -> int:
    """One free port on loopback, not in ``avoid``, outside the ephemeral range (see ``free_base``):
    the port a test or benchmark hands to torchrun or gloo as MASTER_PORT, or to a server it starts, is bound
    only later, by that process, and an outgoing connection must not take it in between."""
    return free_base(1, avoid)


def _kernel_port() -> int:
    """A free port the kernel picks (inside the ephemeral range)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range, both ends included (32768-60999 on Linux by default)."""
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def base_spans(n: int) -> list[tuple[int, int]]:
    """The ranges [a, b] a base of ``n`` consecutive ports is drawn from: from 20000 up to the
    ephemeral range, and above it; empty where that range leaves no room."""
    low, high = ephemeral_range()
    return [(a, b) for a, b in ((20000, low - n), (high + 1, 65536 - n)) if a <= b]


def free_base(n: int, avoid: tuple[int, ...] = ()) -> int:
    """A base port with ``n`` consecutive free ports on loopback, none of them in ``avoid``.

    Drawn outside the ephemeral range (below it, else above it): a port the kernel hands out for
    outgoing connections (the torchrun store's clients, gloo, ZeroMQ) can take a free ephemeral
    port between this check and the exporter's bind, which once failed a CI run ("port base + 1
    ... is not free"). Where the ephemeral range leaves no room (a host with 1024-65535), any
    base is drawn and that race remains."""
    low, high = ephemeral_range()
    spans = base_spans(n)
    rng = random.Random()
    for _ in range(200):
        base = rng.randint(*rng.choice(spans)) if spans else _kernel_port()
        if base + n > 65536 or any(base <= a < base + n for a in avoid):
            continue
        socks = []
        try:
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
    raise RuntimeError(f"no {n} consecutive free ports on loopback outside the ephemeral range {low}-{high}")
