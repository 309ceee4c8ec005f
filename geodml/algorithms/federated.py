"""``--algo fedavg``: FederatedAveraging with the variants the config asks for.

The variants are cooperative subclasses of geodml.algorithms.fedavg.FedAvg, one concept each
(FedAvgM: server momentum, FedProx: proximal term, FedIR: importance weights, IWDS: decaying
imbalance weights, FedVC: virtual clients, FedNova: normalized averaging). This module chooses and composes them, so that FedAvg
itself never imports its subclasses; the registry (geodml.algorithms.REGISTRY) names
:class:`FedAvgFamily` for ``fedavg``.

Which flags select which variant:

* any server-optimizer setting (``--server-momentum > 0``, ``--server-lr != 1``,
  ``--server-nesterov``) -> FedAvgM (beta = 0 with server_lr != 1 is server SGD);
* ``--server-optimizer adagrad|adam|yogi`` -> FedOpt (Reddi et al. 2021; --server-lr is its eta);
* ``--prox-mu > 0`` -> FedProx;  ``--fedir`` -> FedIR;  ``--iwds b0,bm,rho`` -> IWDS (``--iwds-mode``:
  resample or reweight);  ``--fednova`` -> FedNova;
* ``--virtual-client-size > 0`` -> FedVC (its round length replaces ``--iter-local``);
* ``--compress powersgd|qsgd|int8|int4`` -> CompressedUpload (the upload's encoding).

``--local-epochs E`` is no variant: it sets FedAvg's own round structure (ceil(E n_k / B) local
steps per participant), which every variant inherits.

RunConfig has validated every value and rejected ``--fedir`` with ``--iwds`` (both set the
per-class loss weights); settings that do nothing here are warned about.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, ClassVar

from geodml.algorithms.base import AlgoContext, FlatParams
from geodml.algorithms.fedavg import ITER_LOCAL, FedAvg
from geodml.algorithms.fedavgm import FedAvgM
from geodml.algorithms.fedcompress import CompressedUpload
from geodml.algorithms.fedir import FedIR
from geodml.algorithms.fednova import FedNova
from geodml.algorithms.fedopt import FedOpt
from geodml.algorithms.fedprox import FedProx
from geodml.algorithms.fedvc import FedVC
from geodml.algorithms.iwds import IWDS
from geodml.algorithms.knob import KnobSpec
from geodml.config import FedAvgConfig

if TYPE_CHECKING:
    from geodml.comm.api import Comm
    from geodml.config import RunConfig

_ITER_LOCAL_DEFAULT = FedAvgConfig.__dataclass_fields__["iter_local"].default


def variant_class(*, fedavgm: bool = False, fedprox: bool = False, fedir: bool = False, iwds: bool = False,
                  fedvc: bool = False, fednova: bool = False, fedopt: bool = False,
                  compressed: bool = False) -> type[FedAvg]:
    """FedAvg with the chosen variants mixed in (cooperative subclasses; each overrides its own
    hooks and calls ``super()``). FedIR and IWDS both set the per-class loss weights, FedAvgM and
    FedOpt both the server step: rejected."""
    if fedir and iwds:
        raise ValueError("FedIR and IWDS both set the per-class loss weights; choose one")
    if fedavgm and fedopt:
        raise ValueError("FedAvgM and FedOpt are both the server step; choose one")
    chosen: list[type[FedAvg]] = [c for c, on in ((FedVC, fedvc), (FedIR, fedir), (IWDS, iwds), (FedProx, fedprox),
                                                  (FedNova, fednova), (FedAvgM, fedavgm), (FedOpt, fedopt),
                                                  (CompressedUpload, compressed)) if on]
    if not chosen:
        return FedAvg
    if len(chosen) == 1:
        return chosen[0]
    name = "+".join(c.name for c in chosen)
    return type(name.replace("+", "_"), tuple(chosen), {"name": name, "__doc__": f"FedAvg with {name}."})


def fedavg_arguments(cfg: RunConfig, *, flat: FlatParams, comm: Comm, ctx: AlgoContext) -> dict[str, Any]:
    """The keyword arguments of plain FedAvg's constructor from a (validated) config: the parameters,
    Comm and context, the local momentum, --iter-local (or the plugin Config's ``iter_local``: DiLoCo's H),
    --reset-momentum, --client-fraction and --local-epochs. A plugin that extends FedAvg builds itself
    with them (docs/plugins.md)."""
    a = cfg.fedavg
    return dict(flat=flat, comm=comm, momentum=cfg.optim.momentum, ctx=ctx, iter_local=cfg.fedavg_iter_local(),
                reset_momentum=a.reset_momentum, client_fraction=a.client_fraction, local_epochs=a.local_epochs)


def build_fedavg(cfg: RunConfig, *, flat: FlatParams, comm: Comm, ctx: AlgoContext) -> FedAvg:
    """The combination of variants that ``cfg.fedavg`` and ``cfg.compression`` ask for (module docstring), built."""
    a = cfg.fedavg
    if a.server_nesterov and a.server_momentum == 0:
        warnings.warn("--server-nesterov does nothing with --server-momentum 0", stacklevel=3)
    kw = fedavg_arguments(cfg, flat=flat, comm=comm, ctx=ctx)
    fedopt = a.server_optimizer != "sgd"
    server = not fedopt and (a.server_momentum > 0 or a.server_lr != 1.0 or a.server_nesterov)
    if server:
        kw.update(server_momentum=a.server_momentum, server_lr=a.server_lr, nesterov=a.server_nesterov)
    if fedopt:
        kw.update(server_optimizer=a.server_optimizer, server_lr=a.server_lr, server_betas=a.server_betas,
                  server_tau=a.server_tau)
    elif a.server_betas != (0.9, 0.99) or a.server_tau != 1e-3:
        warnings.warn("--server-betas and --server-tau do nothing with --server-optimizer sgd", stacklevel=3)
    if a.prox_mu > 0:
        kw.update(prox_mu=a.prox_mu)
    if a.iwds is not None:
        kw.update(iwds=tuple(a.iwds), iwds_mode=a.iwds_mode)
    elif a.iwds_mode != "reweight":
        warnings.warn(f"--iwds-mode {a.iwds_mode} does nothing without --iwds", stacklevel=3)
    if a.fednova and a.reset_momentum:
        warnings.warn("--reset-momentum does nothing with --fednova: FedNova always resets the local momentum "
                      "every round", stacklevel=3)
    if a.local_epochs > 0 and a.iter_local != _ITER_LOCAL_DEFAULT:
        warnings.warn(f"--iter-local {a.iter_local} is ignored with --local-epochs: participant k takes "
                      f"ceil({a.local_epochs:g} * n_k / batch size) steps per round", stacklevel=3)
    if a.virtual_client_size > 0:
        kw.update(virtual_client_size=a.virtual_client_size)
        if a.iter_local != _ITER_LOCAL_DEFAULT:
            warnings.warn(f"--iter-local {a.iter_local} is ignored with --virtual-client-size: a FedVC round is "
                          f"ceil({a.virtual_client_size} / batch size) steps", stacklevel=3)
    c = cfg.compression
    if c.compress != "none":
        kw.update(compress=c.compress, compress_rank=c.compress_rank, compress_levels=c.compress_levels)
    klass = variant_class(fedavgm=server, fedprox=a.prox_mu > 0, fedir=a.fedir, iwds=a.iwds is not None,
                          fedvc=a.virtual_client_size > 0, fednova=a.fednova, fedopt=fedopt,
                          compressed=c.compress != "none")
    return klass(**kw)


class FedAvgFamily:
    """The registry's entry for ``--algo fedavg`` (geodml.algorithms.AlgorithmFactory)."""

    KNOB: ClassVar[KnobSpec | None] = ITER_LOCAL
    """The knob of ``--algo fedavg`` with default flags: Iter_Local (with FedVC it is N_VC instead)."""

    @staticmethod
    def from_config(cfg: RunConfig, *, flat: FlatParams, comm: Comm, ctx: AlgoContext) -> FedAvg:
        return build_fedavg(cfg, flat=flat, comm=comm, ctx=ctx)
