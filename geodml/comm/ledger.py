"""Byte ledger: every byte a rank sends is charged to a (src region, dst region, kind) link.

Each rank keeps its own ledger of what *it* sent: bytes, messages and emulated seconds (the
link model's ``transfer_s`` of each message, 0 under ``--wan off``). Run totals are the sum
over ranks (gathered once at the end, uncharged) computed by :meth:`Ledger.summarize`.
``wan_bytes_total`` counts only bytes between two different regions; bytes inside one
region are LAN traffic and appear in ``lan_bytes_total`` and ``bytes_by_link``.

Traffic kinds (:data:`KINDS`): ``gradient`` (BSP, DGC), ``update`` (Gaia significant updates,
FedAvg deltas), ``model`` (whole models), ``travel`` (SkewScout model traveling), ``control``
(small coordination messages).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

KINDS = ("gradient", "update", "model", "travel", "control")


@dataclass
class LinkTotals:
    bytes: int = 0
    messages: int = 0
    emulated_s: float = 0.0


PEAK_WINDOW_S = 1.0
"""The window of emulated time over which a link's peak rate is measured (``wan_peak_bps_by_link``)."""


class Ledger:
    """Counts bytes, messages and emulated seconds per (src_region, dst_region, kind), and the bytes
    each WAN link carried in every PEAK_WINDOW_S window of emulated time (its peak rate)."""

    def __init__(self, rank: int, region_of_rank: list[str]) -> None:
        self.rank = rank
        self.region_of_rank = region_of_rank if isinstance(region_of_rank, list) else list(region_of_rank)  # shared
        self.links: dict[tuple[str, str, str], LinkTotals] = defaultdict(LinkTotals)
        self.windows: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
        """(src_region, dst_region) -> window index -> bytes this rank put on that WAN link in the window."""
        self._counted: tuple[tuple[int, ...], list[tuple[str, int]]] = ((), [])
        """charge_each's last tuple of destinations (held, so its id cannot be reused) and its
        destinations per region: a Comm passes the same tuple for every send to all."""

    def charge(self, dst_rank: int, kind: str, num_bytes: int, *, messages: int = 1, emulated_s: float = 0.0) -> None:
        """Charge ``num_bytes`` sent by this rank to ``dst_rank`` as ``kind``."""
        assert kind in KINDS, f"unknown traffic kind {kind!r}"
        assert num_bytes >= 0 and messages >= 0 and emulated_s >= 0
        key = (self.region_of_rank[self.rank], self.region_of_rank[dst_rank], kind)
        t = self.links[key]
        t.bytes += int(num_bytes)
        t.messages += int(messages)
        t.emulated_s += float(emulated_s)

    def record_window(self, dst_rank: int, num_bytes: int, start_s: float, duration_s: float) -> None:
        """``num_bytes`` sent to ``dst_rank`` from emulated ``start_s`` for ``duration_s`` (the transfer time;
        the bytes are spread evenly over it) into the PEAK_WINDOW_S windows it overlaps. Only WAN links;
        only timed runs (``--wan virtual`` / ``real``) call it."""
        src, dst = self.region_of_rank[self.rank], self.region_of_rank[dst_rank]
        if src == dst or num_bytes <= 0:
            return
        w = PEAK_WINDOW_S
        bins = self.windows[(src, dst)]
        first = int(start_s // w)
        if duration_s <= 0:
            bins[first] = bins.get(first, 0.0) + num_bytes
            return
        end = start_s + duration_s
        rate = num_bytes / duration_s
        j = first
        while j * w < end:
            overlap = min(end, (j + 1) * w) - max(start_s, j * w)
            if overlap > 0:
                bins[j] = bins.get(j, 0.0) + rate * overlap
            j += 1

    def window_bytes(self) -> dict[str, dict[int, float]]:
        """This rank's windows, ``"src->dst"`` -> window -> bytes (picklable; :meth:`peaks` combines ranks)."""
        return {f"{s}->{d}": dict(b) for (s, d), b in sorted(self.windows.items())}

    @staticmethod
    def peaks(per_rank: Sequence[Mapping[str, Mapping[int, float]]]) -> dict[str, float]:
        """Each WAN link's peak rate in bits per second: the most bytes that every rank together put on it
        in one PEAK_WINDOW_S window, times 8, over the window."""
        total: dict[str, dict[int, float]] = {}
        for windows in per_rank:
            for link, bins in windows.items():
                acc = total.setdefault(link, {})
                for j, b in bins.items():
                    acc[int(j)] = acc.get(int(j), 0.0) + b
        return {link: 8.0 * max(bins.values()) / PEAK_WINDOW_S for link, bins in sorted(total.items()) if bins}

    def charge_each(self, dst_ranks: Sequence[int], kind: str, num_bytes: int) -> None:
        """``charge(d, kind, num_bytes)`` for every ``d`` in ``dst_ranks`` (one message each, no
        emulated seconds: ``--wan off``), summed per destination region first: the same totals,
        one update per region instead of one per destination (a Gaia step at P partitions sends
        P (P - 1) messages)."""
        assert kind in KINDS, f"unknown traffic kind {kind!r}"
        assert num_bytes >= 0
        regions = self.region_of_rank
        src = regions[self.rank]
        last, counts = self._counted
        if dst_ranks is not last:
            counts = list(Counter(regions[d] for d in dst_ranks).items())
            if type(dst_ranks) is tuple:
                self._counted = (dst_ranks, counts)
        for region, n in counts:
            t = self.links[(src, region, kind)]
            t.bytes += n * int(num_bytes)
            t.messages += n

    # ---- checkpoint ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's totals so far (a resumed run continues them: nothing lost, nothing counted twice)."""
        return {"region": self.region_of_rank[self.rank], "rows": self.rows(), "windows": self.window_bytes()}

    def load_state_dict(self, state: dict) -> None:
        """(The whole placement is the checkpoint fingerprint's business: it holds --topology and
        the number of partitions; checkpoints before 2026-11-23 stored it here, per rank.)"""
        if "region_of_rank" in state:
            saved = list(state["region_of_rank"])
            if saved != list(self.region_of_rank):
                raise ValueError(f"checkpoint ledger places ranks in regions {saved}, this run in "
                                 f"{self.region_of_rank}; resume with the same --topology")
        elif state["region"] != self.region_of_rank[self.rank]:
            raise ValueError(f"checkpoint ledger places rank {self.rank} in region {state['region']}, this run in "
                             f"{self.region_of_rank[self.rank]}; resume with the same --topology")
        self.links.clear()
        self.windows.clear()
        for link, bins in state.get("windows", {}).items():   # (checkpoints before 2026-12-03 have none)
            s, d = link.split("->")
            self.windows[(s, d)] = {int(j): float(b) for j, b in bins.items()}
        for r in state["rows"]:
            self.links[(r["src_region"], r["dst_region"], r["kind"])] = LinkTotals(
                int(r["bytes"]), int(r["messages"]), float(r["emulated_s"]))

    # ---- totals ------------------------------------------------------------------------
    def rows(self) -> list[dict]:
        """This rank's totals, one dict per (src_region, dst_region, kind) (picklable, JSON-ready)."""
        return [
            {"src_region": s, "dst_region": d, "kind": k, "bytes": t.bytes, "messages": t.messages, "emulated_s": t.emulated_s}
            for (s, d, k), t in sorted(self.links.items())
        ]

    @property
    def wan_bytes(self) -> int:
        """Bytes this rank sent to other regions."""
        return sum(t.bytes for (s, d, _), t in self.links.items() if s != d)

    @property
    def total_bytes(self) -> int:
        """Bytes this rank sent, WAN and LAN."""
        return sum(t.bytes for t in self.links.values())

    @staticmethod
    def summarize(rows: list[dict]) -> dict:
        """Run totals from the rows of every rank's ledger (see module docstring).

        Keys: ``wan_bytes_total``, ``lan_bytes_total``, ``wan_bytes_by_kind``,
        ``wan_bytes_by_link`` ("src->dst", WAN pairs only), ``bytes_by_link`` (every pair),
        ``wan_messages_total``, ``messages_total``, ``wan_emulated_seconds_by_link`` and
        ``wan_emulated_seconds_by_kind`` (sum of ``transfer_s`` of the messages: link busy time).
        """
        wan = lan = messages = wan_messages = 0
        by_kind: dict[str, int] = {}
        by_link: dict[str, int] = {}
        wan_by_link: dict[str, int] = {}
        emu_by_link: dict[str, float] = {}
        emu_by_kind: dict[str, float] = {}
        for r in rows:
            link = f"{r['src_region']}->{r['dst_region']}"
            by_link[link] = by_link.get(link, 0) + r["bytes"]
            messages += r["messages"]
            if r["src_region"] != r["dst_region"]:
                wan += r["bytes"]
                wan_messages += r["messages"]
                by_kind[r["kind"]] = by_kind.get(r["kind"], 0) + r["bytes"]
                wan_by_link[link] = wan_by_link.get(link, 0) + r["bytes"]
                emu_by_link[link] = emu_by_link.get(link, 0.0) + r.get("emulated_s", 0.0)
                emu_by_kind[r["kind"]] = emu_by_kind.get(r["kind"], 0.0) + r.get("emulated_s", 0.0)
            else:
                lan += r["bytes"]
        return {
            "wan_bytes_total": wan,
            "lan_bytes_total": lan,
            "wan_bytes_by_kind": dict(sorted(by_kind.items())),
            "wan_bytes_by_link": dict(sorted(wan_by_link.items())),
            "bytes_by_link": dict(sorted(by_link.items())),
            "wan_messages_total": wan_messages,
            "messages_total": messages,
            "wan_emulated_seconds_by_link": dict(sorted(emu_by_link.items())),
            "wan_emulated_seconds_by_kind": dict(sorted(emu_by_kind.items())),
        }
