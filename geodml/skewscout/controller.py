"""SkewScout communication control (Quagmire, Hsieh et al. ICML 2020, §7.2, Equation 1).

Every travel interval the controller receives the measured accuracy loss AL of the current
knob value theta and the bytes C the algorithm sent during the interval, and picks the next
theta from the algorithm's ordered grid (most communication first) by minimizing

    f(theta) = lambda_AL * max(0, AL(theta) - sigma_AL) + lambda_C * C(theta) / CM      (Eq. 1)

with CM the paper's "communication cost for the whole ML model", made concrete for the same
interval as C: the bytes of every partition sending its whole model to every other partition
at every step of the interval (``travel_every x K x (K-1) x model bytes``). C/CM is then the
fraction of full (dense, all-to-all, every-step) communication the algorithm used, in [0, 1]
for Gaia and DGC, so with the paper's weights (§7.3: lambda_AL = 50, lambda_C = 1,
sigma_AL = 5%) accuracy loss dominates, "as our primary goal is to minimize accuracy loss".
(Normalizing by a single model exchange instead lets early-training bytes outweigh a 70%
accuracy loss and makes the search loosen a diverging setting: measured on digits.)

Memoization (Eq. 1's text): AL and C are remembered for every theta explored, most recent
value. An *unexplored* theta needs an estimate; ours is optimistic on accuracy and scaled on
bytes:

* AL_est(theta') = min(AL(current), sigma_AL) if theta' communicates more than the current
  theta (more communication is assumed to fix the divergence), else AL(current) (less
  communication is assumed to cost nothing): optimism makes the search try a neighbour
  before ruling it out, and the memo corrects it once measured.
* C_est(theta') = C(current) * comm_ratio(current, theta'); SkewScout uses
  :func:`inverse_comm_ratio` for every knob (bytes ~ 1/theta, i.e. scaled by theta/theta', as
  for T0 and Iter_Local).

Search strategies (§7.2 names all three; §7.3 found hill climbing best):

* ``hill``: move to the best of {i-1, i, i+1} (ties keep the current theta, then prefer more
  communication);
* ``stochastic``: among the neighbours that improve on the current f, pick one at random with
  probability proportional to the improvement (Russell & Norvig's stochastic hill climbing);
  stay if none improves;
* ``annealing``: propose a random neighbour; accept if it improves, else with probability
  exp(-delta / T), T = temperature * cooling**decision (Van Laarhoven & Aarts).

The controller is pure (no communication): it runs on rank 0 and the trainer broadcasts its
decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from geodml.config import SEARCHES


def inverse_comm_ratio(theta_from: float, theta_to: float) -> float:
    """Bytes under theta_to relative to theta_from when bytes ~ 1/theta (Gaia T0, FedAvg Iter_Local)."""
    return theta_from / theta_to


@dataclass
class Decision:
    """One control step, as logged to metrics.jsonl."""

    theta_before: float
    theta_after: float
    accuracy_loss: float
    bytes_interval: int
    objective: dict[float, float]
    estimated: list[float] = field(default_factory=list)


class Controller:
    """Hill-climbing controller over an ordered grid (index 0 = most communication)."""

    def __init__(self, grid: tuple[float, ...], start: float, *, model_exchange_bytes: int, lambda_al: float = 50.0,
                 lambda_c: float = 1.0, sigma_al: float = 0.05, search: str = "hill",
                 comm_ratio: Callable[[float, float], float] = inverse_comm_ratio, temperature: float = 1.0,
                 cooling: float = 0.9, seed: int = 0) -> None:
        if not grid:
            raise ValueError("SkewScout needs an algorithm with a communication knob (gaia, fedavg, dgc)")
        if search not in SEARCHES:
            raise ValueError(f"--skewscout-search: choose one of {', '.join(SEARCHES)}, got {search!r}")
        if model_exchange_bytes <= 0:
            raise ValueError("model_exchange_bytes must be > 0")
        self.grid = tuple(float(g) for g in grid)
        self.index = self._nearest(float(start))
        self.cm = float(model_exchange_bytes)
        self.lambda_al, self.lambda_c, self.sigma_al = float(lambda_al), float(lambda_c), float(sigma_al)
        self.search = search
        self.comm_ratio = comm_ratio
        self.temperature, self.cooling = float(temperature), float(cooling)
        self.rng = np.random.default_rng([seed, 0x5C0])
        self.al_memo: dict[int, float] = {}
        self.c_memo: dict[int, float] = {}
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

    def _estimate(self, j: int) -> tuple[float, float, bool]:
        """(AL, C, estimated?) for grid index j: memo if explored, else the documented estimate."""
        i = self.index
        if j in self.al_memo:
            return self.al_memo[j], self.c_memo[j], False
        al_cur, c_cur = self.al_memo[i], self.c_memo[i]
        al = min(al_cur, self.sigma_al) if j < i else al_cur
        return al, c_cur * self.comm_ratio(self.grid[i], self.grid[j]), True

    def decide(self, accuracy_loss: float, bytes_interval: int) -> Decision:
        """Record the measurement of the current theta and return the decision."""
        i = self.index
        self.al_memo[i] = float(accuracy_loss)
        self.c_memo[i] = float(bytes_interval)
        cands = [j for j in (i - 1, i, i + 1) if 0 <= j < len(self.grid)]
        f: dict[int, float] = {}
        estimated = []
        for j in cands:
            al, c, est = self._estimate(j)
            f[j] = self.objective(al, c)
            if est:
                estimated.append(self.grid[j])
        nxt = self._choose(i, cands, f)
        d = Decision(theta_before=self.grid[i], theta_after=self.grid[nxt], accuracy_loss=float(accuracy_loss),
                     bytes_interval=int(bytes_interval), objective={self.grid[j]: f[j] for j in cands},
                     estimated=estimated)
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
        return {"index": self.index, "al_memo": dict(self.al_memo), "c_memo": dict(self.c_memo),
                "decisions": self.decisions, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, s: dict) -> None:
        self.index = int(s["index"])
        self.al_memo = {int(k): float(v) for k, v in s["al_memo"].items()}
        self.c_memo = {int(k): float(v) for k, v in s["c_memo"].items()}
        self.decisions = int(s["decisions"])
        self.rng.bit_generator.state = s["rng"]
