"""SkewScout communication control (Quagmire, Hsieh et al. ICML 2020, §7.2, Equation 1).

Every travel interval the controller receives the measured accuracy loss AL of the current
knob value theta (the mean over the K partitions, with its standard error) and the bytes C the
algorithm sent during the interval, and picks the next theta from the algorithm's ordered grid
(most communication first) by minimizing

    f(theta) = lambda_AL * max(0, AL(theta) - sigma_AL) + lambda_C * C(theta) / CM      (Eq. 1)

with CM the paper's "communication cost for the whole ML model", made concrete for the same
interval as C: the bytes of every partition sending its whole model to every other partition
at every step of the interval (``interval x K x (K-1) x model bytes``). C/CM is then the
fraction of full (dense, all-to-all, every-step) communication the algorithm used, in [0, 1]
for Gaia and DGC, so with the paper's weights (§7.3: lambda_AL = 50, lambda_C = 1,
sigma_AL = 5%) accuracy loss dominates, "as our primary goal is to minimize accuracy loss".
(Normalizing by a single model exchange instead lets early-training bytes outweigh a 70%
accuracy loss and makes the search loosen a diverging setting: measured on digits.)

**Memo with uncertainty** (Eq. 1's text: "we memoize the most recent value for each theta").
A measurement of AL is noisy: each partition's AL_k = local - remote accuracy on n examples
each, and the visitor each partition hosts rotates, so one trip says little (100 examples: about
5 pp per partition, 2.3 pp for the mean of five, against sigma_AL = 5 pp). So the memo of theta
is its *most recent visit* -- the measurements of consecutive decisions at theta, the last
``window`` of them (default K-1 in SkewScout: one full rotation of the travel pairs) -- pooled:

    mean = average of the pooled AL values;
    SE   = max( sqrt(sum of their squared standard errors) / m ,  sample sd / sqrt(m) )   (m >= 2)

the first term the sampling error reported by the trips (binomial), the second the spread seen
between trips (pairings, drift), whichever is larger. Leaving theta and coming back starts a new
pool (the model has moved on; "most recent" as the paper). C(theta) is the mean of the pool's bytes.

**Decision rule** (every search strategy): Eq. 1 evaluated on one-sided confidence bounds
(``confidence``, default 0.95: z = 1.645), each chosen against the move:

    stay at i:    f_i = f(AL_lo(i), C(i))       AL_lo = mean - z SE   (staying looks its best)
    move to j:    f_j = f(AL_hi(j), C(j))       AL_hi = mean + z SE   (a move looks its worst)

``hill`` moves to the neighbour j in {i-1, i+1} with the smallest f_j if f_j < f_i, else stays
(ties: stay, then more communication). Read through Eq. 1 this is the issue's rule: tighten only
when AL's *lower* bound exceeds sigma_AL by more than the extra bytes are worth (lambda_C dC/CM /
lambda_AL), loosen only when the *upper* bound of the looser theta (its memo, or the current one
if unexplored) is below sigma_AL up to the bytes saved; a confidence interval that straddles
sigma_AL keeps theta and pools one more trip, so the next decision is surer. Why this keeps Eq. 1's
objective: the objective and its arguments are unchanged, only the AL plugged in is a bound; with
``confidence = 0.5`` (z = 0) and ``window = 1`` the rule is exactly the point-estimate hill climb
with the paper's most-recent memo (tests/test_skewscout_controller.py checks the equivalence). The
bounds make the search move only on evidence, which is what stops noise-driven overshoot (a
walk down to T0 = 2% where 5% sufficed, because one noisy trip showed AL > sigma_AL).

An *unexplored* theta (no memo) is estimated, optimistic on accuracy and scaled on bytes:

* tighter (more communication) than i: AL = min(AL(i), sigma_AL) for mean and both bounds (more
  communication is assumed to fix the divergence); looser: AL(i)'s mean and bounds (less
  communication is assumed to cost nothing). The memo corrects either once measured.
* C_est(theta') = C(i) * comm_ratio(theta_i, theta'); SkewScout uses :func:`comm_ratio_for` the
  grid: bytes ~ 1/theta for an ascending grid (T0, Iter_Local), ~ theta for a descending one
  (E_warm), so the more-communication neighbour is always estimated to cost more.

Search strategies (§7.2 names all three; §7.3 found hill climbing best), all on f_i / f_j above:

* ``hill``: as above;
* ``stochastic``: among the neighbours with f_j < f_i, pick one at random with probability
  proportional to f_i - f_j (Russell & Norvig's stochastic hill climbing); stay if none;
* ``annealing``: propose a random neighbour; accept if f_j <= f_i, else with probability
  exp(-(f_j - f_i) / T), T = temperature * cooling**decision (Van Laarhoven & Aarts).

**Settled decisions** (``Decision.settled``): theta kept, at least two trips in its pool (so their
spread is measured) and the pool's bounds both below or both above sigma_AL. Nothing Eq. 1 weighs
is then in doubt; SkewScout's ``--travel-backoff`` uses it to space out the next decisions.

Known limit (the paper's too, its reason (ii) in §7.3): a looser theta measured bad early keeps
its memo, so the controller does not re-try it late in training when it might have sufficed.

The controller is pure (no communication): it runs on rank 0 and the trainer broadcasts its
decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Callable

import numpy as np

from geodml.config import SEARCHES


def inverse_comm_ratio(theta_from: float, theta_to: float) -> float:
    """Bytes under theta_to relative to theta_from when bytes ~ 1/theta (Gaia T0, FedAvg Iter_Local)."""
    return theta_from / theta_to


def proportional_comm_ratio(theta_from: float, theta_to: float) -> float:
    """Bytes under theta_to relative to theta_from when bytes grow with theta (DGC's E_warm: a longer warm-up
    sends denser updates for longer); a first-order guess, corrected by the memo once measured."""
    return theta_to / theta_from


def comm_ratio_for(grid: tuple[float, ...]) -> Callable[[float, float], float]:
    """The byte estimate matching a grid's order (most communication first): ascending -> 1/theta, descending -> theta."""
    return proportional_comm_ratio if len(grid) > 1 and grid[0] > grid[-1] else inverse_comm_ratio


@dataclass
class Pool:
    """One theta's most recent visit: up to ``window`` measurements (AL, its standard error, bytes)."""

    window: int
    als: list[float] = field(default_factory=list)
    ses: list[float] = field(default_factory=list)
    bytes: list[float] = field(default_factory=list)

    def add(self, al: float, se: float, c: float) -> None:
        assert se >= 0 and self.window >= 1
        for xs, x in ((self.als, al), (self.ses, se), (self.bytes, c)):
            xs.append(float(x))
            del xs[:-self.window]

    @property
    def n(self) -> int:
        return len(self.als)

    @property
    def mean(self) -> float:
        assert self.als, "an empty pool has no mean"
        return float(np.mean(self.als))

    @property
    def se(self) -> float:
        """max(reported: sqrt(sum se^2)/m, between trips: sample sd/sqrt(m)); the latter only with m >= 2."""
        m = self.n
        reported = math.sqrt(sum(s * s for s in self.ses)) / m
        between = float(np.std(self.als, ddof=1)) / math.sqrt(m) if m >= 2 else 0.0
        return max(reported, between)

    @property
    def c(self) -> float:
        return float(np.mean(self.bytes))

    def state_dict(self) -> dict:
        return {"window": self.window, "als": list(self.als), "ses": list(self.ses), "bytes": list(self.bytes)}

    @classmethod
    def from_state(cls, s: dict) -> Pool:
        return cls(int(s["window"]), [float(x) for x in s["als"]], [float(x) for x in s["ses"]],
                   [float(x) for x in s["bytes"]])


@dataclass(frozen=True)
class Estimate:
    """AL (mean and one-sided bounds) and C of one grid point; ``estimated``: no memo, derived from the current."""

    mean: float
    lo: float
    hi: float
    c: float
    estimated: bool


@dataclass
class Decision:
    """One control step, as logged to metrics.jsonl."""

    theta_before: float
    theta_after: float
    accuracy_loss: float
    """This trip's K-partition mean AL."""
    bytes_interval: int
    objective: dict[float, float]
    """f per candidate theta as compared: the current at its AL lower bound, neighbours at their upper bounds."""
    estimated: list[float] = field(default_factory=list)
    accuracy_loss_se: float = 0.0
    """This trip's standard error."""
    pooled: dict[str, float] = field(default_factory=dict)
    """The current theta's pool after this trip: mean, se, n, lo, hi."""
    settled: bool = False
    """Theta kept, at least two trips pooled, and both bounds on one side of sigma_AL: nothing is in doubt
    (SkewScout's ``--travel-backoff`` may then wait longer for the next decision)."""


class Controller:
    """Eq. 1 search over an ordered grid (index 0 = most communication) on pooled, bounded AL (module docstring)."""

    def __init__(self, grid: tuple[float, ...], start: float, *, model_exchange_bytes: int, lambda_al: float = 50.0,
                 lambda_c: float = 1.0, sigma_al: float = 0.05, search: str = "hill",
                 comm_ratio: Callable[[float, float], float] = inverse_comm_ratio, temperature: float = 1.0,
                 cooling: float = 0.9, confidence: float = 0.95, window: int = 4, seed: int = 0) -> None:
        if not grid:
            raise ValueError("SkewScout needs an algorithm with a communication knob (gaia, fedavg, dgc)")
        if search not in SEARCHES:
            raise ValueError(f"--skewscout-search: choose one of {', '.join(SEARCHES)}, got {search!r}")
        if model_exchange_bytes <= 0:
            raise ValueError("model_exchange_bytes must be > 0")
        if not 0.5 <= confidence < 1:
            raise ValueError(f"--al-confidence must be in [0.5, 1), got {confidence!r}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        self.grid = tuple(float(g) for g in grid)
        self.index = self._nearest(float(start))
        self.cm = float(model_exchange_bytes)
        self.lambda_al, self.lambda_c, self.sigma_al = float(lambda_al), float(lambda_c), float(sigma_al)
        self.search = search
        self.comm_ratio = comm_ratio
        self.temperature, self.cooling = float(temperature), float(cooling)
        self.confidence, self.window = float(confidence), int(window)
        self.z = NormalDist().inv_cdf(self.confidence)  # 0.95 -> 1.645; 0.5 -> 0 (the point estimate)
        self.rng = np.random.default_rng([seed, 0x5C0])
        self.memo: dict[int, Pool] = {}
        self.last_index: int | None = None
        """The index of the previous decision's measurement: the current pool continues only while theta stays."""
        self.decisions = 0
        self.history: list[Decision] = []

    def _nearest(self, theta: float) -> int:
        return int(min(range(len(self.grid)), key=lambda i: (abs(self.grid[i] - theta), i)))

    @property
    def theta(self) -> float:
        return self.grid[self.index]

    def objective(self, al: float, c: float) -> float:
        """Equation 1 for one theta."""
        return self.lambda_al * max(0.0, al - self.sigma_al) + self.lambda_c * c / self.cm

    def estimate(self, j: int) -> Estimate:
        """Grid point j from its memo, else the documented estimate from the current theta's memo."""
        if j in self.memo:
            p = self.memo[j]
            m, se = p.mean, p.se
            return Estimate(m, m - self.z * se, m + self.z * se, p.c, False)
        cur = self.estimate(self.index)
        assert not cur.estimated, "the current theta is always measured before estimating its neighbours"
        c = cur.c * self.comm_ratio(self.grid[self.index], self.grid[j])
        if j < self.index:  # more communication: assumed to bring AL down to sigma_AL at most
            s = self.sigma_al
            return Estimate(min(cur.mean, s), min(cur.lo, s), min(cur.hi, s), c, True)
        return Estimate(cur.mean, cur.lo, cur.hi, c, True)

    def decide(self, accuracy_loss: float, bytes_interval: int, accuracy_loss_se: float = 0.0) -> Decision:
        """Pool the measurement of the current theta (AL, its standard error, bytes) and return the decision."""
        if not (math.isfinite(accuracy_loss_se) and accuracy_loss_se >= 0):
            raise ValueError(f"accuracy_loss_se must be a finite number >= 0, got {accuracy_loss_se!r}")
        i = self.index
        if self.last_index != i or i not in self.memo:  # a new visit: the most recent one replaces the memo
            self.memo[i] = Pool(self.window)
        self.memo[i].add(float(accuracy_loss), float(accuracy_loss_se), float(bytes_interval))
        self.last_index = i
        cands = [j for j in (i - 1, i, i + 1) if 0 <= j < len(self.grid)]
        est = {j: self.estimate(j) for j in cands}
        f = {j: self.objective(est[j].lo if j == i else est[j].hi, est[j].c) for j in cands}
        nxt = self._choose(i, cands, f)
        p = self.memo[i]
        settled = nxt == i and p.n >= 2 and (est[i].hi < self.sigma_al or est[i].lo > self.sigma_al)
        d = Decision(theta_before=self.grid[i], theta_after=self.grid[nxt], accuracy_loss=float(accuracy_loss),
                     bytes_interval=int(bytes_interval), objective={self.grid[j]: f[j] for j in cands},
                     estimated=[self.grid[j] for j in cands if est[j].estimated],
                     accuracy_loss_se=float(accuracy_loss_se),
                     pooled={"mean": p.mean, "se": p.se, "n": p.n, "lo": est[i].lo, "hi": est[i].hi},
                     settled=settled)
        self.index = nxt
        self.decisions += 1
        self.history.append(d)
        return d

    def _choose(self, i: int, cands: list[int], f: dict[int, float]) -> int:
        if self.search == "hill":
            # best f; ties: keep current, then the more-communication neighbour (lower index)
            return min(cands, key=lambda j: (f[j], j != i, j))
        neighbours = [j for j in cands if j != i]
        if self.search == "stochastic":
            gains = np.array([max(0.0, f[i] - f[j]) for j in neighbours])
            if gains.sum() <= 0:
                return i
            return int(neighbours[self.rng.choice(len(neighbours), p=gains / gains.sum())])
        # annealing
        j = int(neighbours[self.rng.integers(len(neighbours))])
        delta = f[j] - f[i]
        temp = self.temperature * self.cooling ** self.decisions
        if delta <= 0 or (temp > 0 and self.rng.random() < math.exp(-delta / temp)):
            return j
        return i

    # ---- checkpoint ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"index": self.index, "last_index": self.last_index,
                "memo": {j: p.state_dict() for j, p in self.memo.items()},
                "decisions": self.decisions, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, s: dict) -> None:
        self.index = int(s["index"])
        self.last_index = None if s["last_index"] is None else int(s["last_index"])
        self.memo = {int(j): Pool.from_state(p) for j, p in s["memo"].items()}
        self.decisions = int(s["decisions"])
        self.rng.bit_generator.state = s["rng"]
