"""The Comm contract (docs/design.md "The central interfaces"): what an algorithm may use to talk to
other partitions (:class:`Comm`), and the wider view the run has (:class:`RunComm`).

Two implementations: :class:`geodml.comm.dist.DistComm` (one partition per process:
torch.distributed collectives, ZeroMQ messages) and :class:`geodml.comm.inprocess.InProcessComm`
(several partitions in one process, one thread each). Both charge the ledger by the same rules
(geodml.comm.charged): the same bytes, messages and emulated seconds for the same calls.

Rules every implementation keeps:

* Every byte that leaves a partition goes through the Comm and is charged to its ledger under
  a traffic kind (:data:`geodml.comm.ledger.KINDS`), whether it crosses a socket or not.
* Collectives (charged and ``meta_*``) are collective: every rank calls them, in the same order,
  with tensors of the same shape and dtype.
* Point-to-point messages are tagged (kind, step); messages for other tags that arrive while a
  rank waits are kept for later calls, several messages with one tag arrive in send order.
* Errors: a bad argument (unknown kind, invalid rank or step) raises ``ValueError``; a
  non-sequence ``tensors`` or an unsendable dtype raises ``TypeError``; a peer that does not
  answer within the timeout raises :class:`CommTimeoutError` naming it (nothing already
  received is lost); a closed Comm, an aborted group or a failed transport raises
  :class:`CommError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    import numpy as np
    import torch

    from geodml.comm.ledger import Ledger
    from geodml.comm.topology import Topology, WanLink

_T = TypeVar("_T")


class CommError(RuntimeError):
    """A peer or the transport failed (protocol error, unreachable peer, closed Comm)."""


class CommTimeoutError(CommError, TimeoutError):
    """A wait on a peer passed its deadline; the message names the peer."""


@runtime_checkable
class Comm(Protocol):
    """What an algorithm may use: dense collectives, tagged point-to-point messages, and the
    uncharged bookkeeping collectives its diagnostics need. Used from one thread per rank."""

    @property
    def rank(self) -> int:
        """This partition's rank, 0 .. world_size-1."""
        ...

    @property
    def world_size(self) -> int:
        """Number of partitions K."""
        ...

    @property
    def region_of_rank(self) -> list[str]:
        """Region of every rank (the topology's placement); do not modify."""
        ...

    @property
    def topology(self) -> Topology | None:
        """The topology with ``--wan-scale`` applied (None: a Comm built without one); read it,
        do not modify (a peer graph over its links: geodml.algorithms.graphs)."""
        ...

    @property
    def ledger(self) -> Ledger:
        """What this rank has sent: bytes, messages, emulated link seconds per (src region, dst
        region, kind). Read it; only the Comm charges it."""
        ...

    # ---- charged dense collectives ----------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, kind: str, *, average: bool = False) -> None:
        """In place: the sum (``average``: the mean) over ranks, bit-identical on every rank.
        Charged as a ring all-reduce (geodml.comm.collectives)."""
        ...

    def broadcast(self, tensor: torch.Tensor, src: int, kind: str) -> None:
        """In place: ``src``'s tensor on every rank. Charged to ``src`` as a star."""
        ...

    def all_gather(self, tensor: torch.Tensor, kind: str) -> list[torch.Tensor]:
        """Every rank's tensor (equal shapes) in rank order, as new tensors. Charged as a ring."""
        ...

    # ---- charged point-to-point ---------------------------------------------------------------
    def send(self, dst: int, kind: str, tensors: Sequence[torch.Tensor | np.ndarray], *, step: int,
             wait: bool = True) -> None:
        """One message of ``tensors`` to rank ``dst``, tagged (kind, step); charged envelope +
        tensor bytes (a message without tensors is an uncharged lock-step marker).

        Returns when the caller may overwrite the tensors; ``wait=False`` may return earlier,
        and the tensors must then stay untouched until :meth:`flush` returns. Never waits for
        the receiver to call :meth:`recv`.
        """
        ...

    def send_to_all(self, kind: str, tensors: Sequence[torch.Tensor | np.ndarray], *, step: int,
                    wait: bool = True) -> None:
        """:meth:`send` to every other rank (one message, charged, per peer)."""
        ...

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until the tensors of every ``send(..., wait=False)`` so far may be overwritten;
        :class:`CommTimeoutError` if that takes longer than ``timeout_s`` (default: the Comm's)."""
        ...

    def recv(self, src: int, kind: str, *, step: int, timeout_s: float | None = None) -> list[np.ndarray]:
        """The arrays of the next (kind, step) message from ``src``, waiting at most ``timeout_s``
        (default: the Comm's timeout), else :class:`CommTimeoutError` naming ``src``. The arrays
        belong to the receiver but must be treated as read-only (they may be shared views)."""
        ...

    def recv_from_all(self, kind: str, *, step: int, timeout_s: float | None = None) -> dict[int, list[np.ndarray]]:
        """One (kind, step) message from every other rank, ``{src: arrays}`` in rank order; on a
        timeout, :class:`CommTimeoutError` names the missing ranks and nothing is lost."""
        ...

    def recv_from(self, srcs: Sequence[int], kind: str, *, step: int,
                  timeout_s: float | None = None) -> dict[int, list[np.ndarray]]:
        """One (kind, step) message from each of ``srcs`` (distinct other ranks), ``{src: arrays}`` in
        the order given, with one wait for all of them; a timeout as :meth:`recv_from_all`."""
        ...

    # ---- uncharged bookkeeping (the emulator's own, not the emulated system's) ----------------
    def meta_all_reduce(self, tensor: torch.Tensor) -> None:
        """In place: the sum over ranks. Never charged."""
        ...

    def meta_broadcast(self, tensor: torch.Tensor, src: int) -> None:
        """In place: ``src``'s tensor on every rank. Never charged."""
        ...

    def meta_all_gather_object(self, obj: _T) -> list[_T]:
        """A picklable object from every rank (of the same type on every rank), in rank order, each a
        copy. Never charged."""
        ...


@runtime_checkable
class RunComm(Comm, Protocol):
    """What the run (trainer, checkpoints, metrics, entry point) may use besides :class:`Comm`:
    the emulated clock, the link model, checkpoint state and shutdown."""

    @property
    def emulated_s(self) -> float:
        """This rank's emulated clock in seconds (compute time only under ``--wan off``)."""
        ...

    def advance_compute(self, seconds: float) -> None:
        """Add measured compute time to the emulated clock; ``ValueError`` if negative."""
        ...

    def link(self, src: int, dst: int) -> WanLink:
        """The (bandwidth-scaled) link from rank ``src`` to rank ``dst``; ``ValueError`` without
        a topology or for ``src == dst``."""
        ...

    def wire_rejected(self) -> dict[str, int]:
        """Received messages dropped by the wire checks, by reason; safe to call from another
        thread (the metrics exporter). Empty when nothing crosses a wire."""
        ...

    def state_dict(self) -> dict:
        """Ledger totals and the emulated clock, for checkpoints."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; ``ValueError`` if it comes from another placement."""
        ...

    def close(self) -> None:
        """Release sockets and threads; idempotent. Afterwards point-to-point calls raise :class:`CommError`."""
        ...
