"""Small convex and shallow baselines from the federated-learning papers the study extends.

* ``LogisticRegression``: multinomial logistic regression, flatten -> Linear (a convex
  model: skew-induced accuracy loss there cannot come from normalization or
  non-convexity, which makes it the control in the study).
* ``MLP``: McMahan et al., "Communication-Efficient Learning of Deep Networks from
  Decentralized Data" (AISTATS 2017) §3, the "2NN": flatten -> 200 -> ReLU -> 200 -> ReLU ->
  classes (199,210 parameters on 28x28 MNIST).

Neither has normalization layers; both work on any input shape (they flatten it).
"""

from __future__ import annotations

from torch import Tensor, nn

MLP_HIDDEN = 200


class LogisticRegression(nn.Module):
    """flatten -> Linear(in_features, num_classes); the loss applies the softmax."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x.flatten(1))


class MLP(nn.Module):
    """McMahan et al.'s 2NN: two hidden layers of 200 ReLU units."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = MLP_HIDDEN) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)
