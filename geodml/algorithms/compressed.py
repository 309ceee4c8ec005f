"""The compressed exchange of dense algorithms (``--compress powersgd|qsgd|int8|int4``): BSP's gradient
average and FedAvg's upload. The codecs are geodml.algorithms.codecs; this module moves their bytes.

BSP (:meth:`Compressor.mean`): every step each partition's gradient g_i becomes the mean estimate
every partition applies.

* ``qsgd``, ``int8``, ``int4``: each partition encodes g_i; the payloads are all-gathered (kind
  ``gradient``, charged as a ring all-gather of the payload: (K - 1) payloads per rank); every
  partition decodes all K in rank order and sums them, then divides by K: the same bits everywhere.
  No error feedback (QSGD is unbiased; the block quantizers round to nearest).
* ``powersgd`` (rank ``--compress-rank`` r, torch's ``powerSGD_hook`` with warm start and error
  feedback, from the first step): M = g_i + e_i per compressed matrix; P = M Q; all-reduce P (sum);
  orthogonalize P; Q = M^T P; all-reduce Q, divided by K; g = P Q^T; e_i = M - P Q^T. The parameters
  it does not compress (biases, small matrices) are all-reduced as they are. Three all-reduces a step
  (kind ``gradient``); Q starts as a seeded standard normal, orthogonalized, the same on every rank.
  Error feedback as torch's: e_i = M - the decoded mean (so sum_i e_i is K times the mean's error).

FedAvg's upload (:meth:`Compressor.sum_star` / :meth:`Compressor.sum_all_reduce`): the contribution
p_k (w_t - w^k) is compressed, the rest of FedAvg's message (float buffers, a variant's scalars) is
not. qsgd / int8 / int4: every participant sends its encoded contribution and the raw rest to the
round's leader (its lowest rank), which decodes and sums them in rank order (its own decoded first)
and sends the raw sum back: upload compressed, download full precision. powersgd: as for BSP, on the
sum (Q not divided; e_i = M - the decoded sum / K, so the errors again add up to the sum's error),
over every partition (it needs all K each round: ``--client-fraction 1``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from geodml.algorithms.base import copy_array_into
from geodml.algorithms.codecs import QSGD, BlockQuant, orthogonalize_, powersgd_layout
from geodml.algorithms.fedavg import add_array
from geodml.config import COMPRESSORS

if TYPE_CHECKING:
    from geodml.algorithms.base import AlgoContext, FlatParams
    from geodml.comm.api import Comm

_RNG_TAG = 0x5C5D


class Compressor:
    """One partition's compressed exchange of an n-vector (module docstring); owns its error feedback,
    warm-start Q and rounding generator."""

    def __init__(self, kind: str, *, flat: FlatParams, comm: Comm, ctx: AlgoContext, rank: int = 1,
                 levels: int = 16, message: str = "gradient", extra: int = 0) -> None:
        """``extra``: entries after the n compressed ones that go raw (FedAvg's buffers and scalars)."""
        if kind not in COMPRESSORS[1:]:
            raise ValueError(f"--compress: choose one of {', '.join(COMPRESSORS)}, got {kind!r}")
        self.kind, self.comm, self.ctx, self.message = kind, comm, ctx, message
        self.n = flat.numel
        self.codec: QSGD | BlockQuant | None = None
        self.rng = np.random.default_rng([ctx.seed, ctx.rank, _RNG_TAG])
        if kind == "qsgd":
            self.codec = QSGD(levels)
        elif kind in ("int8", "int4"):
            self.codec = BlockQuant(8 if kind == "int8" else 4)
        if self.codec is not None:
            self.payload_nbytes = self.codec.nbytes(self.n)
            self.payload = ctx.shared.scratch(f"compress.payload.{kind}", self.payload_nbytes, torch.uint8,
                                              torch.device("cpu"))
            return
        self.matrices, self.plain = powersgd_layout([tuple(p.shape) for p in flat.params], rank)
        dtype, dev = flat.data.dtype, flat.data.device
        self.error = torch.zeros(self.n, dtype=dtype, device=dev)                   # e_i
        gen = torch.Generator().manual_seed(int(np.random.default_rng([ctx.seed, _RNG_TAG]).integers(2**62)))
        qs = []
        for m in self.matrices:
            q = torch.randn(m.cols, m.rank, generator=gen, dtype=torch.float64).to(dtype)
            orthogonalize_(q)
            qs.append(q.reshape(-1))
        self.q = torch.cat(qs).to(dev) if qs else torch.zeros(0, dtype=dtype, device=dev)   # warm start, own copy
        # P and the raw spans are this partition's own (small): they hold values across the collectives'
        # waits, where another hosted partition may run its next step (geodml.engine.worker)
        self._p = torch.zeros(sum(m.rows * m.rank for m in self.matrices), dtype=dtype, device=dev)
        self.plain_numel = sum(n for _, n in self.plain)
        self._plain = torch.zeros(self.plain_numel + extra, dtype=dtype, device=dev)   # [raw spans | raw rest]
        self.payload_nbytes = 4 * (self._p.numel() + self.q.numel() + self.plain_numel)

    # ---- PowerSGD ---------------------------------------------------------------------------------
    def _views(self, flat_vec: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(M view into ``flat_vec``, P view, Q view) per compressed matrix."""
        out, po, qo = [], 0, 0
        for m in self.matrices:
            out.append((flat_vec[m.offset:m.offset + m.rows * m.cols].view(m.rows, m.cols),
                        self._p[po:po + m.rows * m.rank].view(m.rows, m.rank),
                        self.q[qo:qo + m.cols * m.rank].view(m.cols, m.rank)))
            po += m.rows * m.rank
            qo += m.cols * m.rank
        return out

    def _powersgd(self, vec: torch.Tensor, mean: bool, rest: torch.Tensor | None = None) -> None:
        """``vec`` (n entries, this partition's) <- the PowerSGD estimate of the sum (or mean) over all K;
        ``rest`` (``extra`` entries) <- its exact sum. Both are read before the first wait and written after
        the last (they may be scratch)."""
        k, e, plain = self.ctx.world_size, self.error, self._plain
        e.add_(vec)                                                  # e holds M = g + e across the waits
        o = 0
        for off, num in self.plain:                                  # the uncompressed spans, and the rest
            plain[o:o + num].copy_(vec[off:off + num])
            o += num
        if rest is not None:
            plain[o:].copy_(rest)
        if plain.numel():
            self.comm.all_reduce(plain, self.message)
        views = self._views(e)
        for mat, p, q in views:
            torch.matmul(mat, q, out=p)
        if self._p.numel():
            self.comm.all_reduce(self._p, self.message)
        for mat, p, q in views:
            orthogonalize_(p)
            torch.matmul(mat.t(), p, out=q)
        if self.q.numel():
            self.comm.all_reduce(self.q, self.message)
            if mean:
                self.q.div_(k)
        o = 0
        for off, num in self.plain:
            vec[off:off + num].copy_(plain[o:o + num])
            if mean:
                vec[off:off + num].div_(k)
            e[off:off + num].zero_()                                 # sent exactly: no error
            o += num
        if rest is not None:
            rest.copy_(plain[o:])
        for (mat, p, q), m in zip(views, self.matrices):
            span = vec[m.offset:m.offset + m.rows * m.cols].view(m.rows, m.cols)
            torch.matmul(p, q.t(), out=span)                         # P Q^T
            mat.sub_(span, alpha=1.0 if mean else 1.0 / k)           # e = M - P Q^T (of the mean: sum / K)

    # ---- BSP -----------------------------------------------------------------------------------------
    def mean(self, grad: torch.Tensor) -> None:
        """``grad`` <- the decoded mean over every partition (module docstring, BSP)."""
        if self.codec is None:
            self._powersgd(grad, mean=True)
            return
        self._encode(grad)
        got = self.comm.all_gather(self.payload, self.message)
        out = grad.detach().numpy() if grad.device.type == "cpu" else np.empty(self.n, np.float32)
        out[:] = 0
        for payload in got:
            self.codec.decode_add(payload.numpy(), out)
        if grad.device.type != "cpu":
            grad.copy_(torch.from_numpy(out))
        grad.div_(self.ctx.world_size)

    def _encode(self, vec: torch.Tensor) -> None:
        x = vec.detach().cpu().numpy()
        pay = self.payload.numpy()
        if isinstance(self.codec, QSGD):
            self.codec.encode(x, pay, self.rng)
        else:
            assert self.codec is not None
            self.codec.encode(x, pay)

    # ---- FedAvg's upload ---------------------------------------------------------------------------------
    def sum_all_reduce(self, wire: torch.Tensor) -> None:
        """PowerSGD: ``wire[:n]`` <- the estimate of the sum over every partition, the rest its exact sum."""
        self._powersgd(wire[:self.n], mean=False, rest=wire[self.n:] if wire.numel() > self.n else None)

    def sum_star(self, wire: torch.Tensor, sel: tuple[int, ...], tag: int, write: Callable[[torch.Tensor], None]) -> None:
        """qsgd / int8 / int4: ``wire`` <- the sum over ``sel`` of the decoded contributions (and the raw rest)
        through ``sel[0]``; ``write(wire)`` writes this participant's message. The leader receives first and
        only then writes its own (``wire`` is scratch: module docstring)."""
        assert self.codec is not None
        n, comm, leader = self.n, self.comm, sel[0]
        rest = wire.numel() > n
        if self.ctx.rank != leader:
            write(wire)
            self._encode(wire[:n])
            comm.send(leader, self.message, [self.payload, wire[n:]] if rest else [self.payload], step=tag)
            copy_array_into(wire, comm.recv(leader, self.message, step=tag)[0])
            return
        got = comm.recv_from(sel[1:], self.message, step=tag)       # one wait for all of them
        write(wire)
        self._encode(wire[:n])
        cpu = wire.device.type == "cpu"
        out = wire[:n].numpy() if cpu else np.empty(n, np.float32)
        out[:] = 0
        self.codec.decode_add(self.payload.numpy(), out)             # its own contribution, decoded
        for r in sel[1:]:                                            # rank order: the same sum on every run
            self.codec.decode_add(np.asarray(got[r][0]), out)
            if rest:
                add_array(wire[n:], got[r][1])
        if not cpu:
            copy_array_into(wire[:n], out)
        for r in sel[1:]:
            comm.send(r, self.message, [wire], step=tag)

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rng": self.rng.bit_generator.state}
        if self.codec is None:
            out.update(error=self.error.clone(), q=self.q.clone())
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        if self.codec is None:
            self.error.copy_(state["error"])
            self.q.copy_(state["q"])


__all__ = ["COMPRESSORS", "Compressor"]
