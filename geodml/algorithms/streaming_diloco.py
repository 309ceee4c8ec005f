"""Streaming DiLoCo (Douillard, Donchev, Rush, Kale, Charles, Garrett, ..., "Streaming DiLoCo with
overlapping communication: Towards a Distributed Free Lunch", arXiv 2501.18512, 2025), written on
geodml's public algorithm API as a subclass of geodml.algorithms.diloco.DiLoCo: ``--algo streaming-diloco``.

DiLoCo with three changes, each a flag:

1. **Streaming partial updates** (``--fragments P``): the model's layers (FlatParams.layers: the
   parameters each module owns) are split into P fragments in the paper's strided pattern, layer i in
   fragment i mod P. Fragment p is synchronized every H inner steps, staggered: after the inner steps
   t with t = (p H / P) mod H, t > 0 (fragment 0 at H, 2H, ... as DiLoCo; fragment p first after p H / P
   steps). Each synchronization is DiLoCo's outer step on that fragment alone: Delta_p = (1/K) sum_k
   (theta_p^global - theta_p^k), then the outer Nesterov step on the fragment's global copy and its
   momentum.
2. **Overlapping communication** (``--overlap-steps tau``): the fragment's outer gradient is sent after
   inner step t and its average is used after inner step t + tau: the workers keep training meanwhile,
   and the fragment is then merged, theta_p^k <- alpha theta_p^k + (1 - alpha) theta_p^global
   (``--mixing-alpha``; alpha = 0 replaces the local fragment by the global one, as DiLoCo does).
3. **Quantized outer gradients** (``--outer-bits 4|32``): each worker's Delta_p goes on the wire in
   4-bit E3M0 (geodml.algorithms.codecs.E3M0, a float32 scale per block of 64); the sum is taken in
   float32 after decoding, as the paper accumulates in full precision. 32: float32 on the wire.

How it moves: the paper's collective is an all-reduce; geodml's blocking collectives cannot overlap
with training, so the sum goes through rank 0 (the leader) point to point, kind ``model``, without
waiting: after inner step t every other worker sends its (encoded) Delta_p / K to the leader; after
step t + ceil(tau / 2) the leader receives them, sums the K decoded contributions in rank order (its
own first; in float64, rounded once, as geodml's all-reduce sums), and sends the sum (re-encoded in
4 bits, or float32) to every worker; after step t + tau each worker receives it and every worker,
the leader too, uses the same decoded sum. 2 (K - 1)
messages per sync, the total of a ring all-reduce's, on the leader's links; each leg overlaps about
tau / 2 inner steps on the emulated clock.

With one fragment, tau = 0, alpha = 0 and 32 bits it is DiLoCo, bit for bit (tests/test_streaming_diloco.py).
The paper's defaults used here: H = 100, alpha = 0.5, 4 bits; tau = 5 (the paper sweeps 1-10);
2 fragments (the paper's are groups of transformer blocks; geodml's small CNNs have 2-5 layers).
Client sampling and ``--local-epochs`` are refused (every worker takes part in every sync).

A checkpoint taken while a fragment's messages are in flight holds each worker's own messages still
in flight (an upload before the leader's receive, the leader's sum before the workers' receive); on
resume every worker hands them to the others with the uncharged bookkeeping gather (they were charged
when sent), so a resumed run has the same models and bytes (its emulated clock may differ by the
in-flight wait).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from geodml.algorithm import AlgoContext, Comm, FlatParams, KnobSpec, RunConfig, copy_array_into, opt, require
from geodml.algorithms.codecs import E3M0
from geodml.algorithms.diloco import DiLoCo

OUTER_BITS = (4, 32)


class _Server:
    """Which syncs the process's shared global copy has applied (one outer step per sync and process)."""

    def __init__(self) -> None:
        self.applied: set[int] = set()


class StreamingDiLoCo(DiLoCo):
    """Streaming DiLoCo on worker k (module docstring)."""

    name = "streaming-diloco"

    @dataclass(kw_only=True)
    class Config(DiLoCo.Config):
        inner_steps: int = opt(100, metavar="H", help="inner steps between two syncs of a fragment (the paper's H = 100)")
        fragments: int = opt(2, metavar="P", help="fragments of the model (layer i in fragment i mod P), synchronized "
                             "in turn every H/P steps")
        overlap_steps: int = opt(5, metavar="TAU", help="inner steps between sending a fragment's outer gradient and "
                                 "using its average (tau; 0: at once)")
        mixing_alpha: float = opt(0.5, help="merge theta_local <- alpha theta_local + (1 - alpha) theta_global (the "
                                  "paper's 0.5; 0: replace, as DiLoCo)")
        outer_bits: int = opt(4, help="outer gradients on the wire: 4 (E3M0, the paper) or 32 "
                              "(float32)")

        def __post_init__(self) -> None:
            super().__post_init__()
            self.outer_bits = int(self.outer_bits)
            require(isinstance(self.fragments, int) and not isinstance(self.fragments, bool) and self.fragments >= 1,
                    f"--fragments must be an integer >= 1, got {self.fragments!r}")
            require(self.fragments <= self.inner_steps, f"--fragments {self.fragments} is more than --inner-steps "
                    f"{self.inner_steps}: fragments sync H/P steps apart")
            require(isinstance(self.overlap_steps, int) and not isinstance(self.overlap_steps, bool)
                    and 0 <= self.overlap_steps < self.inner_steps,
                    f"--overlap-steps must be an integer in [0, --inner-steps), got {self.overlap_steps!r}")
            require(math.isfinite(self.mixing_alpha) and 0 <= self.mixing_alpha < 1,
                    f"--mixing-alpha must be in [0, 1), got {self.mixing_alpha!r}")
            require(self.outer_bits in OUTER_BITS, f"--outer-bits: choose 4 or 32, got {self.outer_bits!r}")

    KNOB: ClassVar[KnobSpec] = DiLoCo.KNOB

    @classmethod
    def check_config(cls, cfg: RunConfig) -> None:
        super().check_config(cfg)
        require(cfg.fedavg.client_fraction == 1.0, "--client-fraction: every Streaming DiLoCo worker takes part in "
                "every fragment's sync; leave --client-fraction out")

    @classmethod
    def from_config(cls, cfg: RunConfig, *, flat: FlatParams, comm: Comm, ctx: AlgoContext) -> StreamingDiLoCo:
        c = cfg.plugin
        return cls(fragments=c.fragments, overlap_steps=c.overlap_steps, mixing_alpha=c.mixing_alpha,
                   outer_bits=c.outer_bits, **cls.diloco_arguments(cfg, flat=flat, comm=comm, ctx=ctx))

    def __init__(self, *, fragments: int = 2, overlap_steps: int = 5, mixing_alpha: float = 0.5, outer_bits: int = 4,
                 **diloco: Any) -> None:
        self.num_fragments, self.tau = int(fragments), int(overlap_steps)
        self.alpha, self.outer_bits = float(mixing_alpha), int(outer_bits)
        super().__init__(**diloco)
        flat, ctx = self.flat, self.ctx
        layers = flat.layers
        if self.num_fragments > len(layers):
            raise ValueError(f"--fragments {self.num_fragments}: the model has {len(layers)} layers with parameters")
        self.spans: list[list[tuple[int, int]]] = [layers[p::self.num_fragments] for p in range(self.num_fragments)]
        self.sizes_p = [sum(n for _, n in s) for s in self.spans]
        h = self.iter_local
        self.offsets = self._offsets(h)
        self.codec = E3M0() if self.outer_bits == 4 else None
        dtype, dev = flat.data.dtype, flat.data.device
        # this worker's own buffers: a fragment's message stays untouched while in flight (send without wait)
        self.delta = [torch.zeros(n, dtype=dtype, device=dev) for n in self.sizes_p]
        self.outbox: list[Any] = [np.zeros(self.codec.nbytes(n), np.uint8) if self.codec else None for n in self.sizes_p]
        self._sum = ctx.shared.scratch("sdiloco.sum", max(self.sizes_p), torch.float32, torch.device("cpu"))
        self._dec = ctx.shared.scratch("sdiloco.decoded", max(self.sizes_p), torch.float32, torch.device("cpu"))
        self._acc = ctx.shared.scratch("sdiloco.acc", max(self.sizes_p), torch.float64, torch.device("cpu"))
        self._srv = ctx.shared.object("sdiloco.server", _Server)
        self.sum_box: list[Any] = [np.zeros(self.codec.nbytes(n), np.uint8) if self.codec else
                                   torch.zeros(n, dtype=torch.float32) for n in self.sizes_p]   # the leader's sum
        self.pending: dict[int, int] = {}      # fragment -> the inner step count its sync started at (its tag)
        self._restored: dict[int, dict[int, np.ndarray]] = {}   # tag -> src -> message (after a resume)
        self.done = 0                                   # inner steps taken
        self.last_merge = [0] * self.num_fragments
        self.syncs_p = [0] * self.num_fragments

    def _offsets(self, h: int) -> list[int]:
        """Fragment p syncs after the inner steps d with d = p H / P (mod H)."""
        return [(p * h // self.num_fragments) % h for p in range(self.num_fragments)]

    def apply_knob(self, value: float) -> None:
        """SkewScout sets H: the fragments' phases follow."""
        super().apply_knob(value)
        if hasattr(self, "offsets"):
            self.offsets = self._offsets(self.iter_local)

    # ---- the schedule -----------------------------------------------------------------------------
    def after_step(self, step: int, lr: float) -> None:
        """Replaces FedAvg's round: start the syncs due after this step, then the leader's sums, then the
        merges of the syncs started tau steps ago."""
        self.done = d = step + 1
        for p in range(self.num_fragments):
            if (d - self.offsets[p]) % self.iter_local == 0:
                self._upload(p, d)
        for p in sorted(self.pending):
            if self.pending[p] + (self.tau + 1) // 2 == d:
                self._leader_sum(p)
        for p in sorted(self.pending):
            if self.pending[p] + self.tau == d:
                self._merge(p)

    def finish(self) -> None:
        """Training ended: the syncs still in flight complete (their bytes were sent)."""
        for p in sorted(self.pending):
            if self.done < self.pending[p] + (self.tau + 1) // 2:
                self._leader_sum(p)
            self._merge(p)

    def _frag(self, vec: torch.Tensor, p: int) -> list[torch.Tensor]:
        return [vec[off:off + n] for off, n in self.spans[p]]

    def _upload(self, p: int, d: int) -> None:
        """This worker's Delta_p / K, encoded, to the leader without waiting (the leader keeps its own)."""
        delta, k = self.delta[p], self.ctx.world_size
        o = 0
        for g, w in zip(self._frag(self.global_w, p), self._frag(self.flat.data, p)):
            torch.sub(g, w, out=delta[o:o + g.numel()])
            o += g.numel()
        delta.mul_(1.0 / k)
        if self.codec is not None:
            self.codec.encode(delta.cpu().numpy(), self.outbox[p])
        if self.ctx.rank != 0:
            self.comm.send(0, "model", [self._own(p)], step=d, wait=False)
        self.pending[p] = d

    def _own(self, p: int) -> np.ndarray:
        return self.outbox[p] if self.codec is not None else self.delta[p].cpu().numpy()

    def _decode_into(self, dec: torch.Tensor, msg: np.ndarray) -> None:
        if self.codec is not None:
            dec.zero_()
            self.codec.decode_add(np.asarray(msg), dec.numpy())
        else:
            copy_array_into(dec, msg)

    def _leader_sum(self, p: int) -> None:
        """The leader: receive the others' Delta_p / K, sum all K in rank order, send the (encoded) sum."""
        if self.ctx.rank != 0:
            return
        tag, k, n = self.pending[p], self.ctx.world_size, self.sizes_p[p]
        got = self._restored.pop(tag, None)
        if got is None and k > 1:
            got = {src: arrs[0] for src, arrs in self.comm.recv_from(tuple(range(1, k)), "model", step=tag).items()}
        total, dec, acc = self._sum[:n], self._dec[:n], self._acc[:n]
        self._decode_into(dec, self._own(p))
        acc.copy_(dec)
        for src in range(1, k):                       # in float64, rounded once (as geodml's all-reduce sums)
            self._decode_into(dec, got[src])                                 # type: ignore[index]
            acc.add_(dec)
        total.copy_(acc)
        if self.codec is not None:
            self.codec.encode(total.numpy(), self.sum_box[p])
        else:
            self.sum_box[p].copy_(total)
        if k > 1:
            self.comm.send_to_all("model", [self._sum_msg(p)], step=tag, wait=False)

    def _sum_msg(self, p: int) -> np.ndarray:
        return self.sum_box[p] if self.codec is not None else self.sum_box[p].numpy()

    def _merge(self, p: int) -> None:
        """Every worker: the decoded sum; the outer step on the fragment's global copy (once per process);
        the merge of the local fragment."""
        tag, n = self.pending.pop(p), self.sizes_p[p]
        if self.ctx.rank == 0:
            msg = self._sum_msg(p)
        else:
            got = self._restored.pop(tag, None)
            msg = got[0] if got is not None else self.comm.recv(0, "model", step=tag)[0]
        total = self._sum[:n]
        self._decode_into(total, msg)
        key = tag * self.num_fragments + p
        if key not in self._srv.applied:                       # the process's global copy: once per sync
            self._srv.applied = {x for x in self._srv.applied if x > key - 2 * self.num_fragments * self.iter_local}
            self._srv.applied.add(key)
            o = 0
            for g, v in zip(self._frag(self.global_w, p), self._frag(self.v, p)):
                seg = total[o:o + g.numel()].to(g.device)
                v.mul_(self.server_momentum).add_(seg)
                g.add_(seg.add_(v, alpha=self.server_momentum), alpha=-self.server_lr)
                o += g.numel()
        for g, w in zip(self._frag(self.global_w, p), self._frag(self.flat.data, p)):
            if self.alpha == 0:
                w.copy_(g)
            else:
                w.mul_(self.alpha).add_(g, alpha=1.0 - self.alpha)
        self.last_merge[p] = self.done
        self.syncs_p[p] += 1

    # ---- what the trainer reads ---------------------------------------------------------------------
    @property
    def models_agree(self) -> bool:
        """Every fragment merged (by replacement) after the last inner step: every worker holds the global model."""
        return self.ctx.world_size == 1 or (self.alpha == 0 and not self.pending
                                            and all(m == self.done for m in self.last_merge))

    @property
    def partitions_hold_global_models(self) -> bool:
        return self.models_agree

    @property
    def global_model_rank(self) -> int | None:
        return 0 if self.models_agree else None

    def stats(self) -> dict[str, float]:
        return {"diloco_outer_steps": float(sum(self.syncs_p)), "sdiloco_in_flight": float(len(self.pending))}

    def _in_flight(self) -> dict[int, np.ndarray]:
        """This worker's messages not yet received, by tag: an upload before the leader's receive; the leader's
        sum before the workers' receive."""
        out = {}
        for p, tag in self.pending.items():
            summed = self.done >= tag + (self.tau + 1) // 2
            if self.ctx.rank == 0 and summed:
                out[tag] = self._sum_msg(p).copy()
            elif self.ctx.rank != 0 and not summed:
                out[tag] = self._own(p).copy()
        return out

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        pending = {}
        for p, tag in self.pending.items():
            pending[p] = {"tag": tag, "own": torch.from_numpy(self._own(p).copy()),
                          "sum": torch.from_numpy(np.array(self._sum_msg(p), copy=True))}
        state["streaming"] = {"done": self.done, "last_merge": list(self.last_merge), "syncs": list(self.syncs_p),
                              "pending": pending, "in_flight": {t: torch.from_numpy(m) for t, m in self._in_flight().items()},
                              "applied": sorted(self._srv.applied)}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        s = state["streaming"]
        self.done, self.last_merge, self.syncs_p = int(s["done"]), list(s["last_merge"]), list(s["syncs"])
        self._srv.applied = set(s["applied"])
        self.pending = {}
        for p, rec in s["pending"].items():
            p = int(p)
            self.pending[p] = int(rec["tag"])
            if self.codec is not None:
                self.outbox[p][:] = rec["own"].numpy()
                self.sum_box[p][:] = rec["sum"].numpy()
            else:
                self.delta[p].copy_(rec["own"])
                self.sum_box[p].copy_(rec["sum"])
        # the messages in flight at the checkpoint: every worker hands its own to the others, uncharged
        everyone = self.comm.meta_all_gather_object(dict(s["in_flight"]))
        self._restored = {}
        for src, msgs in enumerate(everyone):
            for tag, msg in msgs.items():
                if src != self.ctx.rank and (src == 0) != (self.ctx.rank == 0):   # uploads to 0, the sum from 0
                    self._restored.setdefault(int(tag), {})[src] = msg.numpy()


__all__ = ["OUTER_BITS", "StreamingDiLoCo"]
