"""What the partitions hosted by one process share, for algorithms (docs/design.md "Per-partition state
and the engine").

Every partition has its own algorithm object, written as if it were alone in its process: its
attributes are its own state (momentum, accumulated updates, counters, generators), and nothing
outside it assigns them. The engine (geodml.engine) runs a process's partitions one at a time, so
what an algorithm needs only *during* its turn can be one buffer for all of them, and what every
partition of a process holds identically can be kept once. :class:`ProcessShared` (``ctx.shared``)
gives both:

* :meth:`ProcessShared.scratch` -- working memory shared by the process's partitions (selection
  masks, send and receive buffers, a round's message). **Contract:** its contents are undefined at
  the start of the partition's turn and after any Comm call that may wait (a collective, a
  ``recv``): a partition uses a scratch buffer only between two such calls. (A Comm call takes the
  tensors it is given before it waits and writes its result into them after its last wait, so a
  scratch buffer may be passed to one.) The golden tests fill every scratch buffer with garbage at
  every switch between partitions, so an algorithm that breaks the contract fails them.
* :meth:`ProcessShared.tensor` and :meth:`ProcessShared.object` -- one value for the process's
  partitions, for state that is the same on every partition that reads it (FedAvg's global model
  w_t): the first caller creates it.
* :meth:`ProcessShared.lease` / :meth:`ProcessShared.release` -- a buffer that is a partition's own
  for a while (FedAvg's momentum under ``--reset-momentum``, for the rounds it takes part in), from a
  free list, so the process holds as many as are in use at once rather than one per partition.

With one partition in a process (or in a unit test) every call returns a buffer of that partition's
own: the same code, nothing shared.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

_T = TypeVar("_T")


class ProcessShared:
    """One process's shared buffers and values (module docstring)."""

    def __init__(self) -> None:
        self._scratch: dict[tuple, torch.Tensor] = {}
        self._values: dict[str, Any] = {}
        self._free: dict[tuple, list[torch.Tensor]] = {}

    def scratch(self, name: str, shape: int | tuple[int, ...], dtype: torch.dtype,
                device: torch.device | str = "cpu") -> torch.Tensor:
        """The process's working buffer ``name`` of this shape, dtype and device (the same tensor object
        for every partition that asks; contents undefined at every turn: module docstring)."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        key = (name, shape, dtype, torch.device(device))
        buf = self._scratch.get(key)
        if buf is None:
            buf = self._scratch[key] = torch.empty(shape, dtype=dtype, device=device)
        return buf

    def tensor(self, name: str, like: torch.Tensor, init: Callable[[torch.Tensor], object]) -> torch.Tensor:
        """The process's one tensor ``name`` shaped as ``like``; the first caller fills it with ``init``."""
        t = self._values.get(name)
        if t is None:
            t = self._values[name] = torch.empty_like(like)
            init(t)
        return t

    def object(self, name: str, factory: Callable[[], _T]) -> _T:
        """The process's one object ``name``, made by the first caller's ``factory``."""
        if name not in self._values:
            self._values[name] = factory()
        return self._values[name]

    def lease(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """A buffer shaped as ``like`` that is the caller's own until it releases it (contents undefined)."""
        free = self._free.setdefault((name, tuple(like.shape), like.dtype, like.device), [])
        return free.pop() if free else torch.empty_like(like)

    def release(self, name: str, buf: torch.Tensor) -> None:
        """Give back a buffer from :meth:`lease` of ``name`` (the caller must not use it afterwards)."""
        self._free.setdefault((name, tuple(buf.shape), buf.dtype, buf.device), []).append(buf)

    def poison(self) -> None:
        """Fill every scratch buffer with garbage (NaN, -1, True): the engine's test mode, at every
        switch between partitions (geodml.engine.worker.POISON_ENV)."""
        for buf in self._scratch.values():
            if buf.is_floating_point():
                buf.fill_(float("nan"))
            elif buf.dtype == torch.bool:
                buf.fill_(True)
            else:
                buf.fill_(-1)
