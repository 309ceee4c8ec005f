"""Emulated WAN: topologies, the link model, per-link pacing and the emulated clock.

DESIGN.md "WAN emulation". Everything here is pure Python (no sockets, no torch): the Comm
layer (geodml.comm.collectives) applies it to real traffic.

Topology files (``topologies/NAME.toml``)
-----------------------------------------
::

    name = "two-regions"          # optional; default: the file name without .toml
    source = "..."                # required: the public measurement the numbers come from,
                                  # or a plain statement that they are illustrative
    description = "..."           # optional
    regions = ["us", "eu", "asia"]  # required, unique names
    placement = "cyclic"          # rank r -> regions[r % len(regions)] (the default), or
    # placement = ["us", "eu", "eu"]   explicit: rank r -> placement[r]; at most len() ranks
                                  # (TOML: top-level keys come before the first table)

    [lan]                         # optional: link between two ranks of one region
    bandwidth_mbps = 10000        #   (default 10000 Mbit/s, 0.1 ms)
    latency_ms = 0.1

    [default]                     # optional: every region pair that [[links]] does not list;
    bandwidth_mbps = 100          #   without it (or with only one of its two fields, which
    latency_ms = 50               #   links then inherit), every ordered pair must be listed

    [[links]]                     # symmetric: both directions
    between = ["us", "eu"]
    latency_ms = 40               # an omitted field comes from [default]

    [[links]]                     # directed: one direction only
    from = "asia"
    to = "us"
    bandwidth_mbps = 80

``latency_ms`` is one-way (a round-trip measurement is halved), ``bandwidth_mbps`` is in
10^6 bit/s and is what one rank gets to one rank of the other region: links of different rank
pairs do not share capacity (full-bisection WAN between regions). A link listed twice for
the same direction (directed twice, symmetric twice, or symmetric plus directed) is an error.

Default topology (``--topology`` not given, :func:`default_topology`): every rank is its own
region ``dc0`` .. ``dc{K-1}`` and every pair of ranks is joined by one uniform *illustrative*
WAN link of 100 Mbit/s and 50 ms one way (a 100 ms round trip, typical of intercontinental
cloud paths, cf. ``topologies/five-continents.toml``). It is not a measurement.

Link model
----------
``WanLink.transfer_s(B) = latency_ms / 1e3 + B * 8 / (bandwidth_mbps * 1e6)``: the time from the
first byte leaving until the last byte arrives, for a message of B bytes alone on its link.
``--wan-scale X`` multiplies every bandwidth (LAN included) by X; latencies are unchanged.

Emulated clock (``--wan virtual`` and ``real``)
-----------------------------------------------
Each rank keeps its own clock ``C`` in seconds, 0 when its Comm is built:

* ``advance_compute(s)``: ``C += s`` (the trainer reports measured compute time).
* point-to-point send of a B-byte message (msgpack envelope + tensor bytes) to rank d: the
  directed link self->d is a FIFO served at its bandwidth (a :class:`TokenBucket` of depth 0),
  so concurrent messages on one link share it: ``start = max(C, link_free)``,
  ``link_free = start + B*8/bw``, ``arrival = link_free + latency``. The envelope carries
  ``arrival``. Sending does not advance the sender's clock (the NIC works while the sender
  computes, as with ``isend``).
* receive: ``C = max(C, arrival)``; ``recv_from_all`` takes the latest arrival.
* collectives: they are synchronous, so every rank leaves at ``max over ranks of C`` (exchanged
  with an uncharged MAX all-reduce) plus the cost model's duration (geodml.comm.collectives).
  Collectives and point-to-point messages do not contend for a link in the model.

``--wan off`` keeps only the compute time (communication is free) and charges 0 emulated
seconds. ``--wan real`` keeps the same clock as ``virtual`` and additionally makes wall time
follow it: ZeroMQ messages are released by a :class:`Pacer` thread at
``wall_link_free + latency`` computed with a wall-clock :class:`TokenBucket` per directed link,
and collectives are held until their duration has passed after the MAX all-reduce that
synchronizes the ranks. Wall time then approximates the emulated WAN time.
"""

from __future__ import annotations

import heapq
import itertools
import math
import re
import threading
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import geodml

TOPOLOGY_DIR = Path(geodml.__file__).resolve().parent.parent / "topologies"
"""Where a bare ``--topology NAME`` is looked up (``topologies/NAME.toml`` in the repository)."""


class TopologyError(ValueError):
    """A topology file or a placement request is invalid; the message names the file and the fix."""


@dataclass(frozen=True)
class WanLink:
    """One directed link: ``transfer_s(B) = latency + B*8/bandwidth``."""

    bandwidth_mbps: float
    """Bandwidth in 10^6 bit/s."""
    latency_ms: float
    """One-way latency in milliseconds."""

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_mbps * 1e6 / 8.0

    @property
    def latency_s(self) -> float:
        return self.latency_ms / 1e3

    def transfer_s(self, num_bytes: int | float) -> float:
        """Seconds from the first byte sent to the last byte received, alone on the link."""
        return self.latency_s + num_bytes * 8.0 / (self.bandwidth_mbps * 1e6)

    def scaled(self, bandwidth_scale: float) -> WanLink:
        return WanLink(self.bandwidth_mbps * bandwidth_scale, self.latency_ms)

    def to_dict(self) -> dict:
        return {"bandwidth_mbps": self.bandwidth_mbps, "latency_ms": self.latency_ms}


DEFAULT_LAN = WanLink(bandwidth_mbps=10_000.0, latency_ms=0.1)
"""Intra-region link when a topology has no [lan] table (illustrative 10 Gbit/s data-center LAN)."""
DEFAULT_WAN = WanLink(bandwidth_mbps=100.0, latency_ms=50.0)
"""The default topology's link between any two ranks (illustrative, see module docstring)."""

_PER_RANK = "per-rank"
_PER_RANK_REGION = re.compile(r"dc(0|[1-9][0-9]*)")


@dataclass(frozen=True)
class Topology:
    """Regions, the directed links between them and the rank-to-region placement.

    Build one with :func:`load_topology` (validated); ``link`` and ``placement`` raise
    :class:`TopologyError` for a region or a world size the topology cannot serve.
    """

    name: str
    source: str
    regions: tuple[str, ...]
    """Region names; empty for the default topology, whose regions are dc0..dc{K-1}."""
    placement_spec: str | tuple[str, ...]
    """``"cyclic"``, ``"per-rank"`` (default topology) or an explicit tuple of regions."""
    lan: WanLink = DEFAULT_LAN
    default: WanLink | None = None
    links: Mapping[tuple[str, str], WanLink] = field(default_factory=dict)
    description: str = ""
    path: str | None = None
    bandwidth_scale: float = 1.0
    """Every bandwidth is multiplied by this (``--wan-scale``); the stored links are unscaled."""

    # ---- queries ---------------------------------------------------------------------
    def placement(self, world_size: int) -> list[str]:
        """Region of each global rank ``0 .. world_size-1``."""
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise TopologyError(f"{self._where()}: world size must be a positive integer, got {world_size!r}")
        spec = self.placement_spec
        if spec == _PER_RANK:
            return [f"dc{r}" for r in range(world_size)]
        if spec == "cyclic":
            return [self.regions[r % len(self.regions)] for r in range(world_size)]
        if world_size > len(spec):
            raise TopologyError(
                f"{self._where()}: the placement lists {len(spec)} ranks but the run has {world_size}; run at most "
                f"{len(spec)} processes, list a region for every rank in `placement`, or set placement = \"cyclic\"")
        return list(spec[:world_size])

    def link(self, src_region: str, dst_region: str) -> WanLink:
        """The directed link from ``src_region`` to ``dst_region`` (LAN inside one region)."""
        for region in (src_region, dst_region):
            if not self.has_region(region):
                known = "dc0, dc1, ... (one per rank)" if self.placement_spec == _PER_RANK else ", ".join(self.regions)
                raise TopologyError(f"{self._where()}: unknown region {region!r} (regions: {known})")
        if src_region == dst_region:
            link = self.lan
        else:
            link = self.links.get((src_region, dst_region), self.default)
            assert link is not None, "validated: every pair has a link or there is a default"
        return link.scaled(self.bandwidth_scale) if self.bandwidth_scale != 1.0 else link

    def has_region(self, region: str) -> bool:
        if self.placement_spec == _PER_RANK:
            return isinstance(region, str) and _PER_RANK_REGION.fullmatch(region) is not None
        return region in self.regions

    def scaled(self, bandwidth_scale: float) -> Topology:
        """The same topology with every bandwidth multiplied by ``bandwidth_scale`` (``--wan-scale``)."""
        if not (isinstance(bandwidth_scale, (int, float)) and math.isfinite(bandwidth_scale) and bandwidth_scale > 0):
            raise TopologyError(f"--wan-scale must be a positive number, got {bandwidth_scale!r}")
        return replace(self, bandwidth_scale=float(bandwidth_scale))

    def to_dict(self) -> dict:
        """JSON-ready description (for config.json); bandwidths as in the file, plus the scale."""
        return {
            "name": self.name,
            "path": self.path,
            "source": self.source,
            "description": self.description,
            "regions": list(self.regions) if self.placement_spec != _PER_RANK else "dc0..dc{K-1} (one per rank)",
            "placement": self.placement_spec if isinstance(self.placement_spec, str) else list(self.placement_spec),
            "lan": self.lan.to_dict(),
            "default": self.default.to_dict() if self.default else None,
            "links": [{"from": s, "to": d, **lk.to_dict()} for (s, d), lk in sorted(self.links.items())],
            "bandwidth_scale": self.bandwidth_scale,
        }

    def _where(self) -> str:
        return f"topology {self.path}" if self.path else f"topology {self.name!r}"


def default_topology() -> Topology:
    """The topology used when ``--topology`` is not given (see the module docstring).

    Every rank is its own region ``dc<rank>``; every pair of ranks is joined by the illustrative
    :data:`DEFAULT_WAN` link (100 Mbit/s, 50 ms one way). Placement never fails.
    """
    return Topology(name="default", source="illustrative: one region per rank, every pair 100 Mbit/s and 50 ms "
                    "one way (not a measurement)", regions=(), placement_spec=_PER_RANK, lan=DEFAULT_LAN,
                    default=DEFAULT_WAN, description="one region per rank, uniform illustrative WAN")


def shipped_topologies() -> list[str]:
    """Names that ``--topology NAME`` finds in :data:`TOPOLOGY_DIR`."""
    return sorted(p.stem for p in TOPOLOGY_DIR.glob("*.toml"))


def load_topology(name_or_path: str | None) -> Topology:
    """``None`` -> :func:`default_topology`; a bare name -> ``topologies/NAME.toml``; else a path.

    A bare name has no path separator and does not end in ``.toml``. Raises
    :class:`TopologyError` naming the file and the problem.
    """
    if name_or_path is None:
        return default_topology()
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise TopologyError(f"--topology must be a topology name or a path to a .toml file, got {name_or_path!r}")
    text = name_or_path.strip()
    is_path = "/" in text or "\\" in text or text.endswith(".toml")
    path = Path(text).expanduser() if is_path else TOPOLOGY_DIR / f"{text}.toml"
    if not path.is_file():
        if is_path:
            raise TopologyError(f"topology file {path} does not exist")
        raise TopologyError(f"no topology named {text!r}: {path} does not exist; shipped topologies: "
                            f"{', '.join(shipped_topologies()) or '(none)'}; or pass a path to a .toml file")
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise TopologyError(f"topology file {path}: not valid TOML: {e}") from None
    except OSError as e:
        raise TopologyError(f"topology file {path}: cannot be read: {e}") from None
    return topology_from_dict(doc, origin=str(path), default_name=path.stem)


_TOP_KEYS = {"name", "source", "description", "regions", "lan", "default", "links", "placement"}
_LINK_FIELDS = {"bandwidth_mbps", "latency_ms"}
_ENDPOINT_KEYS = frozenset({"between", "from", "to"})


def topology_from_dict(doc: Mapping, *, origin: str = "<dict>", default_name: str = "custom") -> Topology:
    """Validate a parsed topology document (the TOML schema in the module docstring)."""
    where = f"topology file {origin}" if origin != "<dict>" else "topology"

    def fail(msg: str) -> TopologyError:
        return TopologyError(f"{where}: {msg}")

    unknown = set(doc) - _TOP_KEYS
    if unknown:
        raise fail(f"unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(_TOP_KEYS))}")
    source = doc.get("source")
    if not isinstance(source, str) or not source.strip():
        raise fail("`source` is required: cite the public measurement the numbers come from, or say plainly "
                   "that they are illustrative")
    name = doc.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise fail(f"`name` must be a non-empty string, got {name!r}")
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise fail("`description` must be a string")

    regions = doc.get("regions")
    if not isinstance(regions, list) or not regions or not all(isinstance(r, str) and r for r in regions):
        raise fail("`regions` must be a non-empty list of region names")
    dup = sorted({r for r in regions if regions.count(r) > 1})
    if dup:
        raise fail(f"region(s) listed more than once in `regions`: {', '.join(dup)}")
    region_set = set(regions)

    def check_region(r: object, what: str) -> str:
        if r not in region_set:
            raise fail(f"{what}: unknown region {r!r} (regions: {', '.join(regions)})")
        return r  # type: ignore[return-value]

    def number(value: object, what: str, *, positive: bool) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise fail(f"{what} must be a finite number, got {value!r}")
        if positive and value <= 0:
            raise fail(f"{what} must be > 0 (non-positive bandwidth), got {value!r}")
        if not positive and value < 0:
            raise fail(f"{what} must be >= 0 (negative latency), got {value!r}")
        return float(value)

    def link_fields(table: object, what: str, endpoints: frozenset = frozenset()) -> dict[str, float]:
        if not isinstance(table, Mapping):
            raise fail(f"{what} must be a table with bandwidth_mbps and latency_ms")
        extra = set(table) - _LINK_FIELDS - endpoints
        if extra:
            raise fail(f"{what}: unknown key(s) {', '.join(sorted(extra))}; a link has bandwidth_mbps and latency_ms")
        return {key: number(table[key], f"{what}.{key}", positive=key == "bandwidth_mbps")
                for key in sorted(_LINK_FIELDS) if key in table}

    def make_link(fields: dict[str, float], what: str, fallback: Mapping[str, float]) -> WanLink:
        values = {**fallback, **fields}
        for key in sorted(_LINK_FIELDS):
            if key not in values:
                raise fail(f"{what} needs {key} (or a [default] table that gives it)")
        return WanLink(bandwidth_mbps=values["bandwidth_mbps"], latency_ms=values["latency_ms"])

    lan = make_link(link_fields(doc["lan"], "[lan]"), "[lan]", DEFAULT_LAN.to_dict()) if "lan" in doc else DEFAULT_LAN
    # [default] may give only some fields (e.g. one bandwidth for links that list only latencies);
    # it serves unlisted region pairs only when it gives both.
    default_fields = link_fields(doc["default"], "[default]") if "default" in doc else {}
    default = make_link(default_fields, "[default]", {}) if set(default_fields) == _LINK_FIELDS else None

    links: dict[tuple[str, str], WanLink] = {}
    defined_at: dict[tuple[str, str], str] = {}
    raw_links = doc.get("links", [])
    if not isinstance(raw_links, list):
        raise fail("`links` must be an array of tables ([[links]])")
    for i, entry in enumerate(raw_links):
        what = f"links[{i}]"
        if not isinstance(entry, Mapping):
            raise fail(f"{what} must be a table")
        if "between" in entry:
            if "from" in entry or "to" in entry:
                raise fail(f"{what}: use either `between` (symmetric) or `from`/`to` (directed), not both")
            pair = entry["between"]
            if not isinstance(pair, list) or len(pair) != 2:
                raise fail(f"{what}.between must list exactly two regions")
            a, b = (check_region(r, f"{what}.between") for r in pair)
            pairs = [(a, b), (b, a)]
        elif "from" in entry and "to" in entry:
            a, b = check_region(entry["from"], f"{what}.from"), check_region(entry["to"], f"{what}.to")
            pairs = [(a, b)]
        else:
            raise fail(f"{what} needs `between = [A, B]` (symmetric) or `from` and `to` (directed)")
        if a == b:
            raise fail(f"{what} joins region {a!r} to itself; links inside a region are set by [lan]")
        link = make_link(link_fields(entry, what, _ENDPOINT_KEYS), what, default_fields)
        for p in pairs:
            if p in links:
                raise fail(f"duplicate link {p[0]} -> {p[1]}: defined by {defined_at[p]} and again by {what}")
            links[p] = link
            defined_at[p] = what
    if default is None:
        missing = [f"{a} -> {b}" for a in regions for b in regions if a != b and (a, b) not in links]
        if missing:
            raise fail(f"no link for {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''} and no complete "
                       "[default] table; add [[links]] for these pairs or a [default] with bandwidth_mbps and latency_ms")

    placement = doc.get("placement", "cyclic")
    if isinstance(placement, str):
        if placement != "cyclic":
            raise fail(f"`placement` must be \"cyclic\" or a list of regions (one per rank), got {placement!r}")
        spec: str | tuple[str, ...] = "cyclic"
    elif isinstance(placement, list) and placement:
        spec = tuple(check_region(r, f"placement[{i}]") for i, r in enumerate(placement))
    else:
        raise fail("`placement` must be \"cyclic\" or a non-empty list of regions (one per rank)")

    return Topology(name=name, source=source.strip(), regions=tuple(regions), placement_spec=spec, lan=lan,
                    default=default, links=links, description=description,
                    path=origin if origin != "<dict>" else None)


class TokenBucket:
    """Serializer of one directed link: tokens (bytes) accrue at ``rate`` up to ``depth_bytes``.

    ``reserve(B, now)`` takes B tokens, going into debt if needed, and returns the time at which
    the debt is paid: when the last byte of the message has left. With depth 0 (the default,
    the exact link model) this is a FIFO: ``max(now, previous finish) + B/rate``. Times are in
    any one clock's seconds (emulated or ``time.monotonic``); ``now`` must not go backwards.
    """

    def __init__(self, bytes_per_s: float, depth_bytes: float = 0.0) -> None:
        assert bytes_per_s > 0 and depth_bytes >= 0
        self.bytes_per_s = float(bytes_per_s)
        self.depth_bytes = float(depth_bytes)
        self._level = float(depth_bytes)
        self._t: float | None = None

    def reserve(self, num_bytes: float, now: float) -> float:
        if self._t is not None:
            now = max(now, self._t)
            self._level = min(self.depth_bytes, self._level + (now - self._t) * self.bytes_per_s)
        self._t = now
        self._level -= num_bytes
        return now + max(0.0, -self._level) / self.bytes_per_s


class EmulatedClock:
    """One rank's emulated time and the FIFO state of its outgoing links (module docstring)."""

    def __init__(self, links_out: Sequence[WanLink | None]) -> None:
        self.now_s = 0.0
        self._links = list(links_out)
        self._buckets = [TokenBucket(lk.bytes_per_s) if lk is not None else None for lk in self._links]

    def advance(self, seconds: float) -> None:
        self.now_s += seconds

    def send(self, dst: int, num_bytes: int) -> float:
        """Emulated arrival time at ``dst`` of a message sent now; the clock does not move."""
        bucket = self._buckets[dst]
        assert bucket is not None, "no link to self"
        return bucket.reserve(num_bytes, self.now_s) + self._links[dst].latency_s

    def receive(self, arrival_s: float) -> None:
        self.now_s = max(self.now_s, arrival_s)

    def collective(self, start_s: float, duration_s: float) -> None:
        """Leave a collective that every rank entered by ``start_s`` and that took ``duration_s``."""
        self.now_s = max(self.now_s, start_s) + duration_s

    def state_dict(self) -> dict:
        """Emulated time and each outgoing link's FIFO state (for checkpoints)."""
        return {"now_s": self.now_s,
                "buckets": [None if b is None else (b._level, b._t) for b in self._buckets]}

    def load_state_dict(self, state: dict) -> None:
        if len(state["buckets"]) != len(self._buckets):
            raise ValueError(f"checkpoint clock has {len(state['buckets'])} links, this run {len(self._buckets)}")
        self.now_s = float(state["now_s"])
        for b, saved in zip(self._buckets, state["buckets"]):
            if b is not None and saved is not None:
                b._level, b._t = float(saved[0]), None if saved[1] is None else float(saved[1])


class Pacer:
    """A thread that runs callables at given ``time.monotonic()`` instants (``--wan real``).

    ``submit(at, fn)`` never blocks; ``fn`` runs in the pacer thread at ``at`` or as soon as
    possible after it (never before), in time order (ties in submission order). Timed waits
    wake late by a varying amount (~0.1-0.2 ms here), so the pacer keeps a running estimate of
    that lateness, wakes that much early and yields in a loop for the remainder. The first exception raised by
    a callable is kept in ``error`` for the owner to report.
    """

    MAX_WAKE_LATE_S = 0.002
    """Upper bound of the wake-up lateness the pacer compensates by waking early and spinning."""

    def __init__(self, name: str = "geodml-pacer") -> None:
        self._wake_late_s = 1e-4  # running estimate of how late a timed wait wakes
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._busy = 0
        self._closed = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, at: float, fn: Callable[[], None]) -> None:
        with self._cond:
            assert not self._closed, "pacer is closed"
            heapq.heappush(self._heap, (at, next(self._seq), fn))
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._heap) + self._busy

    def flush(self, timeout_s: float) -> bool:
        """Wait until every submitted callable has run; False if ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._heap or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout_s: float = 10.0) -> bool:
        """Stop the thread; callables not yet run are dropped. False if the thread is still
        inside a callable after ``timeout_s``."""
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify_all()
        self._thread.join(timeout=timeout_s)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        with self._cond:
            while True:
                if self._closed:
                    return
                if not self._heap:
                    self._cond.wait()
                    continue
                at = self._heap[0][0]
                left = at - time.monotonic()
                if left > self._wake_late_s:
                    # Timed waits wake late (timer slack, scheduling): aim early by the recent
                    # lateness, then yield-spin the rest, so a release is neither early nor late.
                    target = at - self._wake_late_s
                    if not self._cond.wait(left - self._wake_late_s):
                        late = min(max(time.monotonic() - target, 0.0), self.MAX_WAKE_LATE_S)
                        self._wake_late_s += 0.2 * (late - self._wake_late_s)
                    continue
                if left > 0:
                    self._cond.release()
                    time.sleep(0)  # yield the GIL and the lock while spinning
                    self._cond.acquire()
                    continue
                _, _, fn = heapq.heappop(self._heap)
                self._busy += 1
                self._cond.release()
                try:
                    fn()
                except BaseException as e:  # reported to the owner through .error
                    if self.error is None:
                        self.error = e
                finally:
                    self._cond.acquire()
                    self._busy -= 1
                    self._cond.notify_all()
