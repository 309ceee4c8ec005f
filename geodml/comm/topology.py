"""Emulated WAN topologies: regions, the directed links between them, the link model and the
placement of ranks in regions (docs/design.md "WAN emulation").

Pure Python (no sockets, no torch, no clocks): geodml.comm.pacing applies the link model to
traffic in time, geodml.comm.collectives to the collectives.

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
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

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
        link = self.lan if src_region == dst_region else self.links.get((src_region, dst_region)) or self.default
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




class LinksOut(Protocol):
    """The links out of one rank: ``row[d]`` is the link to rank d, None for the rank itself (or
    for every rank when there is no topology); ``len(row)`` is the number of ranks."""

    def __len__(self) -> int: ...

    def __getitem__(self, dst: int) -> WanLink | None: ...


class RankLinks:
    """``links[s][d]``: the link from rank s to rank d under a topology (None on the diagonal),
    looked up by the ranks' regions when first asked for and kept: memory grows with the pairs
    of regions that talk, not with ranks^2 (10,000 partitions in the default topology's one
    region each would be 10^8 pairs)."""

    __slots__ = ("_topology", "_names", "_region_index", "_pairs")

    def __init__(self, topology: Topology, region_of_rank: Sequence[str]) -> None:
        self._topology = topology
        self._names = sorted(set(region_of_rank))
        index = {name: i for i, name in enumerate(self._names)}
        self._region_index = [index[r] for r in region_of_rank]
        self._pairs: dict[tuple[int, int], WanLink] = {}

    def __len__(self) -> int:
        return len(self._region_index)

    def __getitem__(self, src: int) -> LinkRow:
        if not 0 <= src < len(self._region_index):
            raise IndexError(f"rank {src} out of range for {len(self._region_index)} ranks")
        return LinkRow(self, src)

    def between(self, src: int, dst: int) -> WanLink:
        """The link from rank ``src`` to another rank ``dst``."""
        key = (self._region_index[src], self._region_index[dst])
        link = self._pairs.get(key)
        if link is None:
            link = self._pairs[key] = self._topology.link(self._names[key[0]], self._names[key[1]])
        return link


class LinkRow:
    """The links out of one rank, ``row[d]`` (None for the rank itself); a view of :class:`RankLinks`."""

    __slots__ = ("_links", "_src")

    def __init__(self, links: RankLinks, src: int) -> None:
        self._links, self._src = links, src

    def __len__(self) -> int:
        return len(self._links)

    def __getitem__(self, dst: int) -> WanLink | None:
        return None if dst == self._src else self._links.between(self._src, dst)


class NoLinks:
    """The links out of a rank of a run without a topology (``--wan off``): none, ``row[d]`` is None."""

    __slots__ = ("_n",)

    def __init__(self, world_size: int) -> None:
        self._n = world_size

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, dst: int) -> WanLink | None:
        return None


def rank_links(topology: Topology, region_of_rank: Sequence[str]) -> RankLinks:
    """``links[s][d]``: the link from rank s to rank d under ``topology`` (None on the diagonal)."""
    return RankLinks(topology, region_of_rank)


_TOP_KEYS = {"name", "source", "description", "regions", "lan", "default", "links", "placement"}
_LINK_FIELDS = {"bandwidth_mbps", "latency_ms"}
_ENDPOINT_KEYS = frozenset({"between", "from", "to"})


def topology_from_dict(doc: Mapping, *, origin: str = "<dict>", default_name: str = "custom") -> Topology:
    """Validate a parsed topology document (the TOML schema in the module docstring).

    Raises :class:`TopologyError` naming ``origin`` and the first problem found, checked in this
    order: top-level keys, header, regions, [lan], [default], [[links]], completeness, placement.
    """
    p = _Parser(doc, f"topology file {origin}" if origin != "<dict>" else "topology")
    name, source, description = p.header(default_name)
    regions = p.regions()
    lan = p.make_link(p.link_fields(doc["lan"], "[lan]"), "[lan]", DEFAULT_LAN.to_dict()) if "lan" in doc \
        else DEFAULT_LAN
    # [default] may give only some fields (e.g. one bandwidth for links that list only latencies);
    # it serves unlisted region pairs only when it gives both.
    default_fields = p.link_fields(doc["default"], "[default]") if "default" in doc else {}
    default = p.make_link(default_fields, "[default]", {}) if set(default_fields) == _LINK_FIELDS else None
    links = p.links(default_fields)
    if default is None:
        p.check_complete(links)
    return Topology(name=name, source=source, regions=tuple(regions), placement_spec=p.placement(), lan=lan,
                    default=default, links=links, description=description,
                    path=origin if origin != "<dict>" else None)


class _Parser:
    """The checks of one topology document; every failure is a :class:`TopologyError` naming it."""

    def __init__(self, doc: Mapping, where: str) -> None:
        self.doc, self.where = doc, where
        self._regions: list[str] = []

    def fail(self, msg: str) -> TopologyError:
        return TopologyError(f"{self.where}: {msg}")

    def header(self, default_name: str) -> tuple[str, str, str]:
        """Known top-level keys; ``name``, ``source`` (required, stripped) and ``description``."""
        doc = self.doc
        unknown = set(doc) - _TOP_KEYS
        if unknown:
            raise self.fail(f"unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(_TOP_KEYS))}")
        source = doc.get("source")
        if not isinstance(source, str) or not source.strip():
            raise self.fail("`source` is required: cite the public measurement the numbers come from, or say "
                            "plainly that they are illustrative")
        name = doc.get("name", default_name)
        if not isinstance(name, str) or not name:
            raise self.fail(f"`name` must be a non-empty string, got {name!r}")
        description = doc.get("description", "")
        if not isinstance(description, str):
            raise self.fail("`description` must be a string")
        return name, source.strip(), description

    def regions(self) -> list[str]:
        """The unique, non-empty region names of ``regions``."""
        regions = self.doc.get("regions")
        if not isinstance(regions, list) or not regions or not all(isinstance(r, str) and r for r in regions):
            raise self.fail("`regions` must be a non-empty list of region names")
        dup = sorted({r for r in regions if regions.count(r) > 1})
        if dup:
            raise self.fail(f"region(s) listed more than once in `regions`: {', '.join(dup)}")
        self._regions = regions
        return regions

    def region(self, r: object, what: str) -> str:
        if not isinstance(r, str) or r not in self._regions:
            raise self.fail(f"{what}: unknown region {r!r} (regions: {', '.join(self._regions)})")
        return r

    def number(self, value: object, what: str, *, positive: bool) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(f"{what} must be a finite number, got {value!r}")
        if positive and value <= 0:
            raise self.fail(f"{what} must be > 0 (non-positive bandwidth), got {value!r}")
        if not positive and value < 0:
            raise self.fail(f"{what} must be >= 0 (negative latency), got {value!r}")
        return float(value)

    def link_fields(self, table: object, what: str, endpoints: frozenset = frozenset()) -> dict[str, float]:
        """The link fields a table gives (some may be missing); no other keys than ``endpoints``."""
        if not isinstance(table, Mapping):
            raise self.fail(f"{what} must be a table with bandwidth_mbps and latency_ms")
        extra = set(table) - _LINK_FIELDS - endpoints
        if extra:
            raise self.fail(f"{what}: unknown key(s) {', '.join(sorted(extra))}; a link has bandwidth_mbps and "
                            "latency_ms")
        return {key: self.number(table[key], f"{what}.{key}", positive=key == "bandwidth_mbps")
                for key in sorted(_LINK_FIELDS) if key in table}

    def make_link(self, fields: dict[str, float], what: str, fallback: Mapping[str, float]) -> WanLink:
        values = {**fallback, **fields}
        for key in sorted(_LINK_FIELDS):
            if key not in values:
                raise self.fail(f"{what} needs {key} (or a [default] table that gives it)")
        return WanLink(bandwidth_mbps=values["bandwidth_mbps"], latency_ms=values["latency_ms"])

    def links(self, default_fields: Mapping[str, float]) -> dict[tuple[str, str], WanLink]:
        """``[[links]]``: each directed (src, dst) region pair defined at most once."""
        links: dict[tuple[str, str], WanLink] = {}
        defined_at: dict[tuple[str, str], str] = {}
        raw_links = self.doc.get("links", [])
        if not isinstance(raw_links, list):
            raise self.fail("`links` must be an array of tables ([[links]])")
        for i, entry in enumerate(raw_links):
            what = f"links[{i}]"
            pairs = self._endpoints(entry, what)
            link = self.make_link(self.link_fields(entry, what, _ENDPOINT_KEYS), what, default_fields)
            for pair in pairs:
                if pair in links:
                    raise self.fail(f"duplicate link {pair[0]} -> {pair[1]}: defined by {defined_at[pair]} and "
                                    f"again by {what}")
                links[pair] = link
                defined_at[pair] = what
        return links

    def _endpoints(self, entry: object, what: str) -> list[tuple[str, str]]:
        """The directed pairs one ``[[links]]`` entry defines: two for ``between``, one for ``from``/``to``."""
        if not isinstance(entry, Mapping):
            raise self.fail(f"{what} must be a table")
        if "between" in entry:
            if "from" in entry or "to" in entry:
                raise self.fail(f"{what}: use either `between` (symmetric) or `from`/`to` (directed), not both")
            pair = entry["between"]
            if not isinstance(pair, list) or len(pair) != 2:
                raise self.fail(f"{what}.between must list exactly two regions")
            a, b = (self.region(r, f"{what}.between") for r in pair)
            pairs = [(a, b), (b, a)]
        elif "from" in entry and "to" in entry:
            a, b = self.region(entry["from"], f"{what}.from"), self.region(entry["to"], f"{what}.to")
            pairs = [(a, b)]
        else:
            raise self.fail(f"{what} needs `between = [A, B]` (symmetric) or `from` and `to` (directed)")
        if a == b:
            raise self.fail(f"{what} joins region {a!r} to itself; links inside a region are set by [lan]")
        return pairs

    def check_complete(self, links: Mapping[tuple[str, str], WanLink]) -> None:
        """Without a complete [default], every ordered pair of regions needs a link."""
        regions = self._regions
        missing = [f"{a} -> {b}" for a in regions for b in regions if a != b and (a, b) not in links]
        if missing:
            raise self.fail(f"no link for {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''} and no "
                            "complete [default] table; add [[links]] for these pairs or a [default] with "
                            "bandwidth_mbps and latency_ms")

    def placement(self) -> str | tuple[str, ...]:
        """``"cyclic"`` (the default) or the explicit tuple of regions, one per rank."""
        placement = self.doc.get("placement", "cyclic")
        if isinstance(placement, str):
            if placement != "cyclic":
                raise self.fail(f"`placement` must be \"cyclic\" or a list of regions (one per rank), got "
                                f"{placement!r}")
            return "cyclic"
        if isinstance(placement, list) and placement:
            return tuple(self.region(r, f"placement[{i}]") for i, r in enumerate(placement))
        raise self.fail("`placement` must be \"cyclic\" or a non-empty list of regions (one per rank)")
