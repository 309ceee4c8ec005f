"""The Flower side of ``python -m geodml.bench flower``: the same FedAvg as a geodml run, in Flower's
simulation (run by a Python that has ``flwr[simulation]``; geodml must be importable from it).

Same work, to the bit: the same network with the same initial weights (geodml.models, seeded by the
run's seed), the same partitions (geodml's partitioner and generator), the same client draw each
round (geodml.algorithms.fedavg.select_round), each client's local steps with geodml's minibatch order
and momentum SGD (geodml.trainer.local_gradient, u <- m u - lr g, w <- w + u; the momentum reset
every round, as ``--reset-momentum``), its contribution p_k (w_t - w_k), and the server's sum in
geodml's order and precision (the lowest-ranked participant's contribution plus the others' in rank
order in float32 when a fraction takes part; a float64 sum in rank order rounded once when every
client does), then w_{t+1} = w_t - sum. A client is stateless between rounds, as Flower's are: its
minibatch position is rebuilt from how many local steps it took before (the server says), which
gives the same minibatches as geodml's sampler that continued. Any supernode trains any partition
(the message names it), so the server needs no map from node to partition. The final global model
is saved to ``GEODML_FLOWER_OUT`` and evaluated on the test set there.

Configuration comes from the environment (``GEODML_FLOWER_ARGV``, ``GEODML_FLOWER_OUT``;
geodml/bench/flower.py sets them and calls :func:`simulate`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

ENV = "GEODML_FLOWER_ARGV"
"""The geodml flags of the run being mirrored (JSON list)."""

_CACHE: dict[str, object] = {}


def _setup() -> dict:
    """The run's configuration, data, partitions and initial model (once per process: Ray's actors
    keep their module state between messages)."""
    if "s" in _CACHE:
        return _CACHE["s"]  # type: ignore[return-value]
    torch.set_num_threads(1)
    from geodml.algorithms.base import FlatParams
    from geodml.cli import parse_config
    from geodml.data.datasets import load_dataset, resolve_cache_dir
    from geodml.data.partition import make_partitioner
    from geodml.models import build_from_config, param_multipliers
    from geodml.trainer import steps_per_epoch

    cfg = parse_config(json.loads(os.environ[ENV]))
    ds = load_dataset(cfg.data.dataset, cfg.data.data_dir, seed=cfg.seed, cache_dir=resolve_cache_dir(cfg.data.cache))
    labels = ds.train_y.numpy()
    k = cfg.partitions
    parts = make_partitioner(cfg.data).split(labels, k, np.random.default_rng([cfg.seed, 0xDA7A]))
    model = build_from_config(cfg.model, ds.input_shape, ds.num_classes, generator_seed=cfg.seed,
                              pixel_std=ds.pixel_std)
    flat = FlatParams(model, param_multipliers(cfg.model, model))
    s = {"cfg": cfg, "ds": ds, "parts": parts, "model": model, "flat": flat,
         "spe": steps_per_epoch(len(labels), k, cfg.optim.batch_size),
         "sizes": np.asarray([len(p) for p in parts], dtype=np.int64)}
    _CACHE["s"] = s
    return s


class _Batch:
    """geodml.trainer.Minibatch over the process's model (minibatch buffers preallocated)."""

    def __init__(self, s: dict) -> None:
        cfg, ds = s["cfg"], s["ds"]
        self.model, self.flat, self.optim, self.twin = s["model"], s["flat"], cfg.optim, None
        self.train_x, self.train_y = ds.train_x, ds.train_y
        self.xb = torch.empty((cfg.optim.batch_size, *ds.train_x.shape[1:]), dtype=ds.train_x.dtype)
        self.yb = torch.empty(cfg.optim.batch_size, dtype=ds.train_y.dtype)
        self.idx = torch.empty(cfg.optim.batch_size, dtype=torch.int64)


client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    """Partition ``k``'s local steps of round ``t`` from w_t; replies p_k (w_t - w_k)."""
    from geodml.trainer import BatchSampler, learning_rate, local_gradient
    s = _setup()
    cfg, flat = s["cfg"], s["flat"]
    c = msg.content["config"]
    k, t, before, p = int(c["partition"]), int(c["round"]), int(c["steps-before"]), float(c["p"])
    w_t = torch.from_numpy(msg.content["arrays"].to_numpy_ndarrays()[0].copy())
    mb = _CACHE.get("mb") or _CACHE.setdefault("mb", _Batch(s))
    sampler = BatchSampler(s["parts"][k], cfg.optim.batch_size, cfg.seed, k)
    for _ in range(before):  # the minibatches this partition took in earlier rounds
        sampler.next()
    a = cfg.fedavg
    flat.data.copy_(w_t)
    u = torch.zeros_like(flat.data)
    m = float(cfg.optim.momentum)
    total = a.rounds * a.iter_local
    for j in range(a.iter_local):
        step = t * a.iter_local + j
        lr = learning_rate(cfg.optim, step, s["spe"], total)
        local_gradient(mb, sampler.next(), lambda labels: None)
        u.mul_(m).add_(flat.grad, alpha=-lr)
        flat.data.add_(u)
    delta = torch.sub(w_t, flat.data)  # w_t - w^k
    delta.mul_(p)
    return Message(content=RecordDict({"arrays": ArrayRecord(numpy_ndarrays=[delta.numpy()]),
                                       "config": ConfigRecord({"partition": k})}), reply_to=msg)


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    from geodml.algorithms.fedavg import num_participants, select_round
    from geodml.trainer import evaluate
    s = _setup()
    cfg, flat, model = s["cfg"], s["flat"], s["model"]
    a, k = cfg.fedavg, cfg.partitions
    m = num_participants(a.client_fraction, k)
    nodes = sorted(grid.get_node_ids())
    w = flat.data.clone()
    steps_done = np.zeros(k, dtype=np.int64)
    t0 = time.monotonic()
    for t in range(a.rounds):
        sel = select_round(cfg.seed, t, k, m)
        n = s["sizes"][list(sel)].astype(np.float64)
        ps = n / n.sum()
        arrays = ArrayRecord(numpy_ndarrays=[w.numpy()])
        msgs = [grid.create_message(RecordDict({"arrays": arrays, "config": ConfigRecord(
            {"partition": int(r), "round": t, "steps-before": int(steps_done[r]), "p": float(ps[i])})}),
            "train", nodes[i % len(nodes)], str(t)) for i, r in enumerate(sel)]
        got = {}
        for reply in grid.send_and_receive(msgs):
            if reply.has_error():
                raise RuntimeError(f"round {t}: a client failed: {reply.error}")
            got[int(reply.content["config"]["partition"])] = reply.content["arrays"].to_numpy_ndarrays()[0]
        steps_done[list(sel)] += a.iter_local
        if m == k:  # geodml's all-reduce: a float64 sum in rank order, rounded once
            acc = torch.from_numpy(got[sel[0]]).double()
            for r in sel[1:]:
                acc.add_(torch.from_numpy(got[r]))
            summed = acc.float()
        else:  # geodml's star: the leader's contribution plus the others' in rank order, float32
            summed = torch.from_numpy(got[sel[0]].copy())
            for r in sel[1:]:
                np.add(summed.numpy(), got[r], out=summed.numpy())
        w.sub_(summed)
    train_s = time.monotonic() - t0
    flat.data.copy_(w)
    correct, _ = evaluate(model, s["ds"].test_x, s["ds"].test_y)
    out = Path(os.environ["GEODML_FLOWER_OUT"])
    out.mkdir(parents=True, exist_ok=True)
    torch.save({n: v.detach().clone() for n, v in model.state_dict().items()}, out / "model.pt")
    (out / "summary.json").write_text(json.dumps({"final_val_accuracy": correct / len(s["ds"].test_y),
                                                  "train_seconds": train_s, "rounds": a.rounds, "clients": k}))


def simulate() -> None:
    """Flower's simulation of the run: one supernode per partition, one CPU per client (so Ray runs as
    many clients at once as the machine has cores). Called as ``python -c "import
    geodml.bench.flower_app as a; a.simulate()"``: the apps must be importable by name in Ray's
    workers (from ``__main__`` cloudpickle would ship them by value, this module's state with them)."""
    from flwr.simulation import run_simulation
    argv = json.loads(os.environ[ENV])
    run_simulation(server_app=server, client_app=client, num_supernodes=int(argv[argv.index("--partitions") + 1]),
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
