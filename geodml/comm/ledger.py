"""Byte ledger: every byte a rank sends is charged to a (src region, dst region, kind) link.

Each rank keeps its own ledger of what *it* sent; run totals are the sum over ranks
(gathered once at the end, uncharged). ``wan_bytes_total`` counts only bytes between two
different regions; bytes inside one region are LAN traffic and appear in ``lan_bytes_total``
and ``by_link``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

KINDS = ("gradient", "update", "model", "travel", "control")


@dataclass
class LinkTotals:
    bytes: int = 0
    messages: int = 0
    emulated_s: float = 0.0


class Ledger:
    """Counts bytes, messages and emulated seconds per (src_region, dst_region, kind)."""

    def __init__(self, rank: int, region_of_rank: list[str]) -> None:
        self.rank = rank
        self.region_of_rank = list(region_of_rank)
        self.links: dict[tuple[str, str, str], LinkTotals] = defaultdict(LinkTotals)

    def charge(self, dst_rank: int, kind: str, num_bytes: int, *, messages: int = 1, emulated_s: float = 0.0) -> None:
        """Charge ``num_bytes`` sent by this rank to ``dst_rank`` as ``kind``."""
        assert kind in KINDS, f"unknown traffic kind {kind!r}"
        assert num_bytes >= 0 and messages >= 0
        key = (self.region_of_rank[self.rank], self.region_of_rank[dst_rank], kind)
        t = self.links[key]
        t.bytes += int(num_bytes)
        t.messages += int(messages)
        t.emulated_s += float(emulated_s)

    # ---- totals ------------------------------------------------------------------------
    def rows(self) -> list[dict]:
        return [
            {"src_region": s, "dst_region": d, "kind": k, "bytes": t.bytes, "messages": t.messages, "emulated_s": t.emulated_s}
            for (s, d, k), t in sorted(self.links.items())
        ]

    @property
    def wan_bytes(self) -> int:
        return sum(t.bytes for (s, d, _), t in self.links.items() if s != d)

    @staticmethod
    def summarize(rows: list[dict]) -> dict:
        """Run totals from the rows of every rank's ledger (see module docstring)."""
        wan = lan = 0
        by_kind: dict[str, int] = {}
        by_link: dict[str, int] = {}
        messages = 0
        for r in rows:
            if r["src_region"] != r["dst_region"]:
                wan += r["bytes"]
                by_kind[r["kind"]] = by_kind.get(r["kind"], 0) + r["bytes"]
            else:
                lan += r["bytes"]
            link = f"{r['src_region']}->{r['dst_region']}"
            by_link[link] = by_link.get(link, 0) + r["bytes"]
            messages += r["messages"]
        return {
            "wan_bytes_total": wan,
            "lan_bytes_total": lan,
            "wan_bytes_by_kind": dict(sorted(by_kind.items())),
            "wan_bytes_by_link": dict(sorted(by_link.items())),
            "messages_total": messages,
        }
