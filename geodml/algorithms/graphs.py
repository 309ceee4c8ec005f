"""Peer graphs for gossip and their Metropolis-Hastings mixing weights (pure functions).

A graph on K partitions is a tuple of neighbour tuples (undirected: j in N(i) iff i in N(j); no
self-loops), every tuple sorted. The shapes (:data:`GRAPHS`):

* ``ring``: i - 1 and i + 1 (mod K); K = 2 is one edge.
* ``torus``: the K partitions on an r x c grid with wrap-around, r the largest divisor of K with
  r <= sqrt(K) (K = 12: 3 x 4), rank i at row i // c, column i % c; up, down, left, right. A prime K
  has no such grid (r = 1 would be a ring): refused. r = 2 or c = 2 gives one neighbour, not two, in
  that direction (the wrap-around is the same edge).
* ``exponential``: i +- 2^j (mod K) for every 2^j < K (the undirected exponential graph of Ying et
  al. 2021, "Exponential graph is provably efficient for decentralized deep training").
* ``complete``: every other partition.
* ``topology``: partitions in the same region, and partitions whose regions the topology file
  joins by a listed link (either direction); an unlisted pair (the file's ``[default]``) is no edge.

Metropolis-Hastings weights (Xiao & Boyd 2004; Lian et al. 2017 use a symmetric doubly stochastic
W): W_ij = 1 / (1 + max(d_i, d_j)) on an edge, W_ii = 1 - sum_j W_ij. On the complete graph every
weight is 1/K: gossip is then the all-reduce average.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

GRAPHS = ("ring", "torus", "exponential", "complete", "topology")

Graph = tuple[tuple[int, ...], ...]


def _undirected(k: int, pairs: set[tuple[int, int]]) -> Graph:
    nbrs: list[set[int]] = [set() for _ in range(k)]
    for i, j in pairs:
        if i != j:
            nbrs[i].add(j)
            nbrs[j].add(i)
    return tuple(tuple(sorted(n)) for n in nbrs)


def torus_shape(k: int) -> tuple[int, int]:
    """(rows, columns) of the torus on ``k`` partitions (module docstring); ValueError for a prime or k < 4."""
    r = max((d for d in range(2, math.isqrt(k) + 1) if k % d == 0), default=1)
    if r == 1:
        raise ValueError(f"--graph torus: {k} partitions have no r x c grid with 2 <= r <= c (a prime number, or "
                         "fewer than 4); use --graph ring, or a number of partitions such as 4, 6, 8, 9, 12")
    return r, k // r


def build_graph(kind: str, k: int, *, regions: Sequence[str] = (),
                links: Mapping[tuple[str, str], object] | None = None) -> Graph:
    """The neighbours of every partition for ``--graph kind`` (module docstring). ``regions``: each
    partition's region; ``links``: the topology's listed links (only for ``topology``)."""
    pairs: set[tuple[int, int]] = set()
    if kind == "ring":
        pairs = {(i, (i + 1) % k) for i in range(k)} if k > 1 else set()
    elif kind == "torus":
        r, c = torus_shape(k)
        for i in range(k):
            row, col = divmod(i, c)
            pairs |= {(i, ((row + 1) % r) * c + col), (i, row * c + (col + 1) % c)}
    elif kind == "exponential":
        step = 1
        while step < k:
            pairs |= {(i, (i + step) % k) for i in range(k)}
            step *= 2
    elif kind == "complete":
        pairs = {(i, j) for i in range(k) for j in range(i + 1, k)}
    elif kind == "topology":
        if len(regions) != k:
            raise ValueError(f"--graph topology needs the region of each of the {k} partitions")
        joined = {frozenset(p) for p in (links or {})}
        pairs = {(i, j) for i in range(k) for j in range(i + 1, k)
                 if regions[i] == regions[j] or frozenset((regions[i], regions[j])) in joined}
    else:
        raise ValueError(f"--graph: choose one of {', '.join(GRAPHS)}, got {kind!r}")
    return _undirected(k, pairs)


def metropolis_hastings(graph: Graph) -> list[dict[int, float]]:
    """Row i of W as ``{j: W_ij}`` over j in N(i) and i itself (module docstring)."""
    deg = [len(n) for n in graph]
    rows = []
    for i, nbrs in enumerate(graph):
        row = {j: 1.0 / (1 + max(deg[i], deg[j])) for j in nbrs}
        row[i] = 1.0 - sum(row.values())
        rows.append(row)
    return rows


def is_connected(graph: Graph) -> bool:
    seen, todo = {0}, [0]
    while todo:
        for j in graph[todo.pop()]:
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return len(seen) == len(graph)


__all__ = ["GRAPHS", "Graph", "build_graph", "is_connected", "metropolis_hastings", "torus_shape"]
