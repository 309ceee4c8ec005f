"""FederatedAveraging (McMahan et al., 2017) exactly as Algorithm 2 of Quagmire (Hsieh et al.,
ICML 2020) Appendix A, on node k, plus client sampling:

    u^k <- 0                                      (line 1, once: the buffer is kept across rounds)
    for round t:
        w^k <- w_t                                (line 3: start from the global model)
        Iter_Local times:                         (lines 4-7: local vanilla momentum SGD)
            u^k <- m*u^k - lr*grad f(w^k, b);  w^k <- w^k + u^k
        w_{t+1} <- sum_k p_k w^k                  (line 8: average; all-reduce, kind ``model``)

Averaging weights ``p_k = n_k / sum_{j in S_t} n_j`` over the round's participants S_t (n_k =
partition size, McMahan et al.; equal sizes give the paper's 1/K). The average is computed as
a server step on the averaged update ``delta = sum_k p_k (w_t - w^k)``: ``w_{t+1} = w_t - delta``
(Hsu et al. 2019, Section 4.2); FedAvgM (geodml.algorithms.fedavgm) replaces only that step.
Float BatchNorm buffers are averaged with the same weights in the same all-reduce.

Round structure on the trainer's step count: a round is ``round_length()`` consecutive trainer
steps (``--iter-local``; FedVC: ceil(N_VC / B)). With ``--local-epochs E`` participant k takes
ceil(E n_k / B) local steps instead (McMahan et al. 2017's E; partitions of unequal size take
unequal numbers of steps) and the round lasts as long as its longest participant: the others
stop computing after their own steps (``computes`` is False; neither weights nor momentum move)
and wait for the average. The average happens in ``after_step`` of the
round's last step; if training ends mid-round, ``finish()`` averages the partial round, so the
final model is always a global one. The next round is set up right after an average (not after
the run's last step, so no bytes are spent on a round that never runs).

Client sampling (``--client-fraction C``, McMahan et al. Algorithm 1: m = max(floor(C*K), 1)):
round t's participants S_t are a seeded draw ``np.random.default_rng([seed, t, 0xFEDA])``,
identical on every rank. Only participants compute (``computes`` is False elsewhere) and only
they exchange bytes; the others wait and are charged nothing. With m < K the average goes
through the ZeroMQ point-to-point transport as a star: every participant but the lowest-ranked
sends its weighted contribution to the lowest-ranked one, which sums them in rank order and
sends the sum back (kind ``model``; 2(m-1) model-sized messages per round -- the same total as
a ring all-reduce among the m, concentrated on the leader's links; every participant ends with
the same bits). A participant that missed the last average does not hold w_t: at the start of
round t it downloads the global state (w_t, the server momentum if any, BatchNorm buffers) from
the lowest rank of S_{t-1}, charged to that sender as kind ``model``. Non-participants keep
their stale model; ``global_model_rank`` names a rank that holds the global one. With m = K
(the paper's setting) the average is one ``Comm.all_reduce`` (ring cost model) and there are
no downloads.

Diagnostic (Quagmire Appendix G, Figure 23): at every synchronization the *average local
update delta* ``mean_{k in S_t} ||w^k - w_t|| / ||w_{t+1}||`` -- how far each participant's
local model moved during the round, relative to the averaged global model -- is reported as
``fedavg_local_update_delta`` in metrics.jsonl. Norm ratios are used instead of the per-weight
ratio |dw_i / w_i|, which is unbounded for weights near zero. The norms are summed with the
uncharged ``meta_all_reduce`` (bookkeeping, not traffic of the emulated system).

Variants compose as cooperative subclasses, one concept each (geodml.algorithms.federated
builds the combination ``--algo fedavg`` asks for): FedAvgM (server momentum), FedProx (proximal
term), FedIR (importance weights), IWDS (decaying imbalance weights), FedVC (virtual clients),
FedNova (normalized averaging). Variants change the averaged message through ``contribute`` and
``aggregate`` (FedNova appends ``wire_extra`` scalars to it) and the server step through ``server_update``.
A variant sets its own attributes *before* calling ``super().__init__``, because FedAvg's
constructor sets up round 0. FedAvg is its own ``work`` (geodml.algorithms.base.LocalWork): the
trainer asks it whether this partition computes, which examples and how they weigh.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from geodml.algorithms.base import AlgoContext, Algorithm, BatchSource, FlatParams, LocalWork, copy_array_into
from geodml.algorithms.knob import KnobSpec

if TYPE_CHECKING:
    from geodml.comm.api import Comm

_SELECT_TAG = 0xFEDA

ITER_LOCAL = KnobSpec("iter_local", (5.0, 10.0, 20.0, 50.0, 200.0, 500.0, 1000.0))
"""SkewScout's knob for FedAvg: Iter_Local, Quagmire Appendix H, Table 7's grid, most communication
(fewest local steps) first."""


def num_participants(client_fraction: float, world_size: int) -> int:
    """m = max(floor(C * K), 1) (McMahan et al. 2017, Algorithm 1); the epsilon absorbs 0.6*5 = 3.0000000000000004."""
    return max(1, min(world_size, math.floor(client_fraction * world_size + 1e-9)))


def select_round(seed: int, round_index: int, world_size: int, num_selected: int) -> tuple[int, ...]:
    """Round ``round_index``'s participants, sorted: all, or ``num_selected`` drawn uniformly without
    replacement from a generator seeded by (seed, round) -- identical on every rank."""
    if num_selected == world_size:
        return tuple(range(world_size))
    rng = np.random.default_rng([seed, round_index, _SELECT_TAG])
    return tuple(sorted(int(i) for i in rng.choice(world_size, size=num_selected, replace=False)))


def local_steps(size: int, local_epochs: float, batch_size: int) -> int:
    """ceil(E * n_k / B) local steps of a partition of ``size`` examples (McMahan et al. 2017's u_k =
    E n_k / B; at least 1)."""
    return max(1, math.ceil(local_epochs * int(size) / batch_size - 1e-9))


def round_steps(sizes: np.ndarray, *, rounds: int, seed: int, client_fraction: float, batch_size: int,
                iter_local: int, local_epochs: float = 0.0, virtual_client_size: int = 0) -> list[int]:
    """Trainer steps of each of the first ``rounds`` rounds, as FedAvg and its variants run them: Iter_Local
    each; FedVC ceil(N_VC / B) each; with --local-epochs the longest participant's local steps of each
    round, from the partition ``sizes`` and the seeded client draw (what ``--rounds`` sums)."""
    if virtual_client_size > 0:
        return [local_steps(virtual_client_size, 1.0, batch_size)] * rounds   # FedVC's round_length
    if local_epochs <= 0:
        return [int(iter_local)] * rounds
    k = len(sizes)
    m = num_participants(client_fraction, k)
    return [max(local_steps(sizes[i], local_epochs, batch_size) for i in select_round(seed, t, k, m))
            for t in range(rounds)]


class FedAvg(Algorithm):
    """FederatedAveraging on node k (see the module docstring for the exact contract)."""

    name = "fedavg"
    # FedIR self-normalizes its per-sample weights within each minibatch (Hsu et al. 2020, eq. 4).
    self_normalized_weights = False
    # Scalars a variant appends to the averaged message (FedNova: its share of tau_eff).
    wire_extra = 0
    # A partition that does not compute at a step (not selected, or done with its local steps) runs
    # no hook that reads the gradient (local_update is skipped; the average reads weights).
    idle_steps_read_grad = False

    def __init__(self, *, flat: FlatParams, comm: Comm, momentum: float, ctx: AlgoContext, iter_local: int = 20,
                 reset_momentum: bool = False, client_fraction: float = 1.0, local_epochs: float = 0.0) -> None:
        """Hyper-parameters as RunConfig validated them (--iter-local >= 1, --client-fraction in (0, 1],
        --local-epochs >= 0; 0: every participant takes Iter_Local steps)."""
        # --reset-momentum: u^k matters only within a round it takes part in: a leased buffer then (zeroed at
        # the round's start), a zero tensor the process's partitions share (never written) otherwise
        idle_u = ctx.shared.tensor("fedavg.idle_u", flat.data, torch.Tensor.zero_) if reset_momentum else None
        super().__init__(flat=flat, comm=comm, momentum=momentum, ctx=ctx, momentum_buffer=idle_u)
        # hyper-parameters
        self.iter_local = int(iter_local)
        self.local_epochs = float(local_epochs)
        self.reset_momentum = bool(reset_momentum)
        self.client_fraction = float(client_fraction)
        self.num_selected = num_participants(self.client_fraction, ctx.world_size)
        # per-run tables, one per process (a process may host thousands of partitions)
        self.sizes = ctx.shared.object("fedavg.sizes", lambda: np.asarray(ctx.label_counts, dtype=np.int64).sum(axis=1))
        self._selections: dict[int, tuple[int, ...]] = ctx.shared.object("fedavg.selections", dict)  # round -> who
        if len(self.sizes) != ctx.world_size:
            raise ValueError(f"label_counts has {len(self.sizes)} rows for {ctx.world_size} partitions")
        if self.reset_momentum:
            self._idle_u = self.u
        # internal state: preallocated flat buffers (docs/design.md rule 12)
        n = flat.numel
        self.nbuf = sum(b.numel() for b in flat.float_buffers)
        dtype, dev, sc = flat.data.dtype, flat.data.device, ctx.shared.scratch
        # w_t, the round's starting model: one copy per process (geodml.algorithms.shared), current whenever
        # a hosted partition reads it (``_server`` says which round it holds)
        self.global_w = ctx.shared.tensor("fedavg.global_w", flat.data, lambda t: t.copy_(flat.data))
        self._server = ctx.shared.object("fedavg.server", _ServerRound)
        # scratch shared by a process's partitions (geodml.algorithms.shared), each used within a turn:
        # one round's message [update (n) | BatchNorm buffers (nbuf) | a variant's scalars (wire_extra)],
        # a download's payload, a minibatch's sample weights
        self.wire = sc("fedavg.wire", n + self.nbuf + self.wire_extra, dtype, dev)
        self._download_numel = sum(t.numel() for t in self.server_state()) + self.nbuf
        self._download = sc("fedavg.download", self._download_numel, dtype, dev)
        self._diag = torch.zeros(3, dtype=torch.float64, device=dev)
        self._sample_w = sc("fedavg.sample_weights", ctx.batch_size, dtype, dev)
        self.round = 0                  # index t of the current round
        self.steps_in_round = 0         # trainer steps done in the current round
        self.round_len = 0
        self.my_local_steps = 0         # this partition's local steps in the current round
        self.selected: tuple[int, ...] = ()
        self.holders: frozenset[int] = ctx.shared.object(                  # ranks holding w_t (all at t=0)
            "fedavg.everyone", lambda: frozenset(range(ctx.world_size)))
        self._pending_knob: float | None = None      # a knob value set mid-round, applied at the next round
        # statistics
        self.syncs = 0
        self.download_count = 0
        self.last_delta = float("nan")
        self._delta_sum = 0.0
        self._delta_n = 0
        # with --local-epochs a round's length comes from the participants' data, so Iter_Local is no
        # knob (RunConfig refuses --skewscout there; the summary's theta_final is null, not Iter_Local)
        self.knob = None if self.local_epochs > 0 else self.knob_spec().bind(get=self._get_knob, set=self._set_knob)
        self._begin_round()

    # ---- round structure (overridden by FedVC) -------------------------------------------
    def round_length(self) -> int:
        """Trainer steps per round: Iter_Local; with --local-epochs the most local steps of any
        participant (called after the round's participants are chosen)."""
        if self.local_epochs > 0:
            return max(self.local_steps_of(k) for k in self.selected)
        return self.iter_local

    def local_steps_of(self, rank: int) -> int:
        """Local steps partition ``rank`` takes in a round it is selected for: Iter_Local, or with
        --local-epochs E, ceil(E * n_k / B) (McMahan et al. 2017's u_k = E n_k / B; at least 1)."""
        if self.local_epochs > 0:
            return local_steps(int(self.sizes[rank]), self.local_epochs, self.ctx.batch_size)
        return self.round_len

    def select_partitions(self, round_index: int) -> tuple[int, ...]:
        """Round ``round_index``'s participants (``select_round``: uniform, seeded by (seed, round)),
        drawn once per process and round."""
        memo = self._selections
        got = memo.get(round_index)
        if got is None:
            got = memo[round_index] = select_round(self.ctx.seed, round_index, self.ctx.world_size, self.num_selected)
            for old in [r for r in memo if r < round_index - 1]:
                del memo[old]
        return got

    def averaging_weights(self, selected: tuple[int, ...]) -> np.ndarray:
        """p_k over the participants: proportional to partition size (McMahan et al.)."""
        n = self.sizes[list(selected)].astype(np.float64)
        return n / n.sum()

    def on_round_start(self) -> None:
        """Per-round setup of a variant (IWDS: beta_t). Called on every rank after the download."""

    # ---- what this partition computes (LocalWork) -------------------------------------------
    @property
    def work(self) -> LocalWork:
        return self

    @property
    def is_selected(self) -> bool:
        return self.ctx.rank in self.selected

    def computes(self, step: int) -> bool:
        """Only the round's participants compute, each for its own local steps (all of the round's
        steps unless --local-epochs gives participants different numbers of steps)."""
        return self.is_selected and self.steps_in_round < self.my_local_steps

    def batch_indices(self, step: int, sampler: BatchSource) -> np.ndarray:
        """The partition's sampler (FedVC overrides: the round's virtual client)."""
        return sampler.next()

    def label_weights(self) -> torch.Tensor | None:
        """Per-class loss weights of this partition ([C]), or None (FedIR, IWDS override)."""
        return None

    def valid_in_batch(self) -> int:
        """Examples of this step's minibatch that count (FedVC pads its last minibatch)."""
        return self.ctx.batch_size

    def sample_weights(self, labels: torch.Tensor, step: int) -> torch.Tensor | None:
        """Weights w_i with loss = mean(w_i * l_i): the class table looked up per label (1 without
        one), zero on padding, scaled so the loss is the mean over the valid examples -- or, for
        self-normalized weights (FedIR), sum(w_i l_i) / sum(w_i) over them."""
        table = self.label_weights()
        b, r = len(labels), self.valid_in_batch()
        if table is None and r == b:
            return None
        w = self._sample_w[:b]
        if table is None:
            w.fill_(1.0)
        else:
            torch.index_select(table, 0, labels, out=w)
        if r < b:
            w[r:] = 0.0
        total = float(w[:r].sum()) if self.self_normalized_weights else float(r)
        return w.mul_(b / total)

    # ---- hooks -----------------------------------------------------------------------------
    def local_update(self, step: int, lr: float) -> None:
        """The local momentum-SGD step, on the steps this partition computes (a participant that has
        no work at a step does not move: not even its momentum)."""
        if self.computes(step):
            super().local_update(step, lr)

    def after_step(self, step: int, lr: float) -> None:
        self.steps_in_round += 1
        if self.steps_in_round == self.round_len:
            self._synchronize()
            if step + 1 < self.ctx.total_steps:
                self._begin_round()

    def finish(self) -> None:
        """Average a partial last round (training ended before its Iter_Local steps)."""
        if self.steps_in_round > 0:
            self._synchronize()

    # ---- the round -------------------------------------------------------------------------
    def plan_round(self) -> list[int]:
        """Round t's set-up that needs no message: a pending knob value, the round's length and
        participants; returns the participants that do not hold w_t (sorted)."""
        if self._pending_knob is not None:
            self.apply_knob(self._pending_knob)
            self._pending_knob = None
        self.selected = self.select_partitions(self.round)
        self.round_len = self.round_length()
        self.my_local_steps = self.local_steps_of(self.ctx.rank)
        self.steps_in_round = 0
        return sorted(set(self.selected) - self.holders)

    def _begin_round(self) -> None:
        """Choose round t's participants, bring stale ones up to date, reset momentum if asked."""
        stale = self.plan_round()
        if stale:
            self._download_global(src=min(self.holders), stale=stale)
        if self.is_selected:
            assert self._server.round == self.round, "a participant reads the process's w_t of its round"
            self.flat.data.copy_(self.global_w)             # line 3: w^k <- w_t
            if self.reset_momentum:
                self._lease_u()
                self.u.zero_()
        self.on_round_start()

    def _lease_u(self) -> None:
        """--reset-momentum: this participant's u^k for the round (geodml.algorithms.shared.lease)."""
        if self.u is self._idle_u:
            self.u = self.ctx.shared.lease("fedavg.u", self._idle_u)

    def _release_u(self) -> None:
        """--reset-momentum: the round is over; its u^k goes back (the next round starts from zero)."""
        if self.u is not self._idle_u:
            self.ctx.shared.release("fedavg.u", self.u)
            self.u = self._idle_u

    def server_state(self) -> list[torch.Tensor]:
        """Tensors a participant must hold besides BatchNorm buffers: w_t (FedAvgM adds v)."""
        return [self.global_w]

    def _download_global(self, src: int, stale: list[int]) -> None:
        tensors = self.server_state() + list(self.flat.float_buffers)
        buf = self._download
        tag = 2 * self.round + 1
        if self.ctx.rank == src:
            pack_into(tensors, buf)
            for dst in stale:
                self.comm.send(dst, "model", [buf], step=tag)
        elif self.ctx.rank in stale:
            copy_array_into(buf, self.comm.recv(src, "model", step=tag)[0])
            unpack_from(buf, tensors)
            self._server.round = self.round      # the process's copy holds w_t now
            self.download_count += 1
            self.on_server_state()
        self.holders = self.holders | frozenset(stale)

    def sum_contributions(self, buf: torch.Tensor, sel: tuple[int, ...], p: float) -> None:
        """The exchange hook: this participant's contribution (``write_contribution(buf, p)``) summed over
        the round's participants ``sel`` into ``buf`` in place, every participant ending with the same
        bits (called by participants only). All K: one all-reduce. Fewer: a star through ``sel[0]``, which
        receives the others' contributions first and only then writes its own (``buf`` is scratch, which
        holds nothing across a wait: geodml.algorithms.shared); the sum is its own, then the others' in
        rank order. A plugin that changes what goes on the wire (examples/topk_fedavg.py) overrides this."""
        if len(sel) == self.ctx.world_size:
            self.write_contribution(buf, p)
            self.comm.all_reduce(buf, "model")
            return
        leader, tag = sel[0], 2 * self.round
        if self.ctx.rank != leader:
            self.write_contribution(buf, p)
            self.comm.send(leader, "model", [buf], step=tag)
            copy_array_into(buf, self.comm.recv(leader, "model", step=tag)[0])
            return
        got = self.comm.recv_from(sel[1:], "model", step=tag)   # one wait for all of them
        self.write_contribution(buf, p)
        for r in sel[1:]:                                   # rank order: the same sum on every run
            add_array(buf, got[r][0])
        for r in sel[1:]:
            self.comm.send(r, "model", [buf], step=tag)

    def write_contribution(self, wire: torch.Tensor, p: float) -> None:
        """This participant's message into ``wire``: ``p_k (w_t - w^k)`` (a variant's ``contribute``) in its
        first ``flat.numel`` entries, then its weighted float buffers and a variant's scalars; also the
        Appendix G sums' first two."""
        n = self.flat.numel
        delta = wire[:n]
        torch.sub(self.global_w, self.flat.data, out=delta)          # w_t - w^k
        self._diag[0] = torch.linalg.vector_norm(delta)
        self._diag[1] = 1.0
        bufs = wire[n:n + self.nbuf]
        self.contribute(delta, p)                                    # p_k (w_t - w^k)
        pack_into(self.flat.float_buffers, bufs)
        bufs.mul_(p)

    def _synchronize(self) -> None:
        """Line 8 over the participants; every rank calls it (non-participants are charged nothing)."""
        sel = self.selected
        n = self.flat.numel
        delta = self.wire[:n]
        diag = self._diag                    # [sum_k ||w^k - w_t||, |S|, ||w_{t+1}|| / |S|] (Appendix G)
        diag.zero_()
        if self.is_selected:
            p = float(self.averaging_weights(sel)[sel.index(self.ctx.rank)])
            bufs = self.wire[n:n + self.nbuf]
            self.sum_contributions(self.wire, sel, p)
            step = self.aggregate(delta)
            if self._server.round == self.round:     # once per process: its hosted participants share w_t
                self.server_update(step)                                  # w_{t+1}
                self._server.round = self.round + 1
            self.on_server_state()
            self.flat.data.copy_(self.global_w)
            unpack_from(bufs, self.flat.float_buffers)
            diag[2] = torch.linalg.vector_norm(self.global_w) / len(sel)
        self.comm.meta_all_reduce(diag)
        self.end_round(diag.tolist())

    def end_round(self, diag: list[float]) -> None:
        """The bookkeeping after round t's average, given the Appendix G sums ``diag`` over the
        participants (see ``_synchronize``): the delta statistic, the holders of w_{t+1}, t + 1."""
        d = diag
        self.last_delta = d[0] / d[1] / d[2] if d[2] > 0 else float("nan")
        self._delta_sum += self.last_delta
        self._delta_n += 1
        self.holders = frozenset(self.selected)
        if self.reset_momentum:
            self._release_u()
        self.steps_in_round = 0
        self.syncs += 1
        self.round += 1

    def contribute(self, delta: torch.Tensor, p: float) -> None:
        """Turn this participant's local change ``delta = w_t - w^k`` (in place) and the ``wire_extra``
        scalars after the buffers into what it adds to the round's sum: ``p_k * delta`` (FedNova
        overrides: normalized by its local steps)."""
        delta.mul_(p)

    def aggregate(self, summed: torch.Tensor) -> torch.Tensor:
        """The averaged update the server applies, from the participants' summed contributions
        (``summed`` is the start of the wire; the extra scalars follow the buffers). FedAvg: the sum itself."""
        return summed

    def server_update(self, delta: torch.Tensor) -> None:
        """w_{t+1} = w_t - delta (plain model averaging). FedAvgM overrides. Called once per process
        and round: the process's hosted participants share the server state (``server_state``)."""
        self.global_w.sub_(delta)

    def on_server_state(self) -> None:
        """This partition now holds the current server state (after its round's average, or a
        download): a variant's statistics of it (FedAvgM) are taken here."""

    # ---- what the trainer reads --------------------------------------------------------------
    @property
    def models_agree(self) -> bool:
        """True right after an average when every partition took part (or K = 1)."""
        return self.ctx.world_size == 1 or (self.steps_in_round == 0 and len(self.holders) == self.ctx.world_size)

    @property
    def partitions_hold_global_models(self) -> bool:
        """Every partition holds w_t of some round: the final one after the last average, or, having sat
        out, the one of the round after its last participation."""
        return True

    @property
    def global_model_rank(self) -> int | None:
        """A rank whose weights are the global model right now (at a round boundary), else None."""
        return min(self.holders) if self.steps_in_round == 0 else None

    # ---- SkewScout's knob: Iter_Local (FedVC: N_VC) ------------------------------------------
    def knob_spec(self) -> KnobSpec:
        """The knob's name and grid (FedVC overrides)."""
        return ITER_LOCAL

    def knob_value(self) -> float:
        """The knob's setting of the current round: Iter_Local (FedVC overrides: N_VC)."""
        return float(self.iter_local)

    def apply_knob(self, value: float) -> None:
        """Set the knob at a round boundary: Iter_Local (FedVC overrides: N_VC)."""
        self.iter_local = int(value)

    def _get_knob(self) -> float:
        """The knob's get: the setting in force for the next round (a pending change included)."""
        return float(self._pending_knob) if self._pending_knob is not None else self.knob_value()

    def _set_knob(self, value: float) -> None:
        """The knob's set: at once between rounds, else from the next round (every rank sets it at
        the same step, so every rank switches at the same round)."""
        if value is None or int(value) != value or value < 1:
            raise ValueError(f"{self.name}: {self.knob_spec().name} must be an integer >= 1, got {value!r}")
        if self.steps_in_round == 0:
            self._pending_knob = None
            self.apply_knob(float(value))
            self.round_len = self.round_length()
            self.my_local_steps = self.local_steps_of(self.ctx.rank)
        else:
            self._pending_knob = float(value)

    def stats(self) -> dict[str, float]:
        """Round counters; after the first average also the last one's Appendix G local update
        delta and the mean over the averages since the previous call (one call per log line)."""
        out = {"fedavg_round": float(self.round), "fedavg_participants": float(len(self.selected)),
               "fedavg_round_steps": float(self.round_len)}
        if self.syncs:
            out["fedavg_local_update_delta"] = self.last_delta
        if self._delta_n:
            out["fedavg_local_update_delta_mean"] = self._delta_sum / self._delta_n
        self._delta_sum, self._delta_n = 0.0, 0
        return out

    # ---- checkpoint ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"u": self.u.clone(), "global_w": self.global_w.clone(), "round": self.round,
                "steps_in_round": self.steps_in_round, "iter_local": self.iter_local,
                "holders": sorted(self.holders), "syncs": self.syncs, "pending_theta": self._pending_knob}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self.reset_momentum:
            self.u.copy_(state["u"])
        self.iter_local = int(state["iter_local"])
        self.round = int(state["round"])
        self.holders = frozenset(int(r) for r in state["holders"])
        if self.ctx.rank in self.holders:  # a holder's copy is w_t: the process's copy (others' may be stale)
            self.global_w.copy_(state["global_w"])
            self._server.round = self.round
        self.syncs = int(state["syncs"])
        self.selected = self.select_partitions(self.round)
        self.round_len = self.round_length()
        self.my_local_steps = self.local_steps_of(self.ctx.rank)
        self.steps_in_round = int(state["steps_in_round"])
        if self.reset_momentum:  # a participant of the round under way continues from its u^k
            self._release_u()
            if self.is_selected:
                self._lease_u()
                self.u.copy_(state["u"])
        self._pending_knob = state.get("pending_theta")
        self.on_round_start()


class _ServerRound:
    """Which round's w_t the process's copy of the server state holds (FedAvg's ``_server``)."""

    __slots__ = ("round",)

    def __init__(self) -> None:
        self.round = 0


def add_array(buf: torch.Tensor, arr: np.ndarray) -> None:
    if buf.device.type == "cpu":
        np.add(buf.numpy(), arr.reshape(-1), out=buf.numpy())
    else:
        buf.add_(torch.from_numpy(np.array(arr).reshape(-1)).to(buf.device))


def pack_into(tensors: list[torch.Tensor], buf: torch.Tensor) -> None:
    off = 0
    for t in tensors:
        buf[off:off + t.numel()].copy_(t.reshape(-1))
        off += t.numel()


def unpack_from(buf: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    off = 0
    for t in tensors:
        t.copy_(buf[off:off + t.numel()].view_as(t))
        off += t.numel()
