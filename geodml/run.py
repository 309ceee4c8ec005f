"""One run, end to end (DESIGN.md "How a run flows"): build every component, train, write
the run directory, and close everything in ``finally``.

Run directory contract: config.json, partitions.json, metrics.jsonl, summary.json, model.pt
(the global model), rank<k>/model.pt (each partition's own model).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from geodml import __version__
from geodml.config import RunConfig
from geodml.runtime import Env


def check_before_start(cfg: RunConfig, env: Env) -> None:
    """Everything that can be checked before a process group exists (raises ValueError)."""
    from geodml.comm.wan import load_topology
    from geodml.data.datasets import check_dataset_available
    from geodml.runtime import resolve_backend

    resolve_backend(cfg.backend, env.local_world_size, cfg.device)
    if cfg.skewscout.enabled:
        if cfg.algo.algo not in ("gaia", "fedavg", "dgc"):
            raise ValueError(f"--skewscout tunes a communication knob; --algo {cfg.algo.algo} has none (use gaia, fedavg or dgc)")
        if env.world_size < 2:
            raise ValueError("--skewscout travels models between partitions: run at least 2 processes (torchrun --nproc_per_node=K)")
    check_dataset_available(cfg.data.dataset, cfg.data.data_dir)
    if cfg.metrics_port and cfg.metrics_port + env.local_world_size - 1 > 65535:
        raise ValueError(f"--metrics-port {cfg.metrics_port}: the {env.local_world_size} ranks of this node need ports up to "
                         f"{cfg.metrics_port + env.local_world_size - 1}; choose a base <= {65536 - env.local_world_size}")
    load_topology(cfg.comm.topology).placement(env.world_size)
    if cfg.out is not None:
        out = Path(cfg.out)
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out} exists and is not a directory")
        if (out / "summary.json").exists():
            raise ValueError(f"--out {out} already holds a finished run (summary.json); choose another --out or remove it")
    from geodml.checkpoint import check_before_start as check_checkpoints
    check_checkpoints(cfg, env.world_size)  # --resume/--checkpoint-every flags and checkpoint files


def host_info() -> dict:
    """What a run's floating-point results depend on beyond the code and flags. Runs are
    bit-reproducible for the same commit, flags and host, but torch picks its CPU kernels by
    instruction set (AVX2 vs AVX-512 round differently), so two machines can differ in the last
    bits and, over a long run, in the accuracy (REPRODUCTION.md, determinism note)."""
    from geodml import kernels
    return {"torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cuda": torch.version.cuda, "selection_kernels": kernels.describe()}


def _write_json(path: Path, obj) -> None:
    """Write atomically (temp file + rename): a crash never leaves a half-written file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


class _Startup:
    """Per-rank start-up breakdown in seconds: process start -> run() (interpreter, imports, flag
    parsing: ``imports_s``), process group + run directory, ZeroMQ mesh, data (load + partition),
    model/algorithm/trainer set-up; plus this process's peak RSS when the report is written."""

    def __init__(self) -> None:
        import psutil
        self.laps: dict[str, float] = {"imports_s": max(0.0, time.time() - psutil.Process().create_time())}
        self._t = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps[name] = now - self._t
        self._t = now

    def done(self) -> None:
        self.laps["total_s"] = sum(v for k, v in self.laps.items() if k != "total_s")

    def report(self, **extra) -> dict:
        import resource
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        return {**extra, **{k: round(v, 4) for k, v in self.laps.items()}, "peak_rss_bytes": int(peak_kib) * 1024}


def _save_torch(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _vs_bsp_line(summary: dict, world: int) -> str:
    """One line comparing the run's WAN bytes with BSP's over the same steps ('' for BSP itself)."""
    from geodml.metrics.sinks import human_bytes
    if summary["algo"] == "bsp" or world < 2:
        return ""
    bsp, savings = summary["bsp_equivalent_wan_bytes"], summary["wan_savings_vs_bsp"]
    if not bsp:
        return ""  # every rank in one region: BSP would send nothing over the WAN either
    ratio = "no WAN bytes at all" if savings is None else f"{savings:.1f}x fewer WAN bytes than BSP"
    return (f"vs BSP: BSP sends {human_bytes(bsp)} ({bsp:,} B) in the same {summary['steps']} steps (one ring "
            f"all-reduce of the gradients per step, computed) -> {ratio}\n")


def run(cfg: RunConfig, env: Env) -> dict | None:
    """Train one partition per process; returns the summary on rank 0 (None elsewhere)."""
    from geodml.algorithms import AlgoContext, FlatParams, build_algorithm
    from geodml.comm import build_comm
    from geodml.data.datasets import load_dataset, resolve_cache_dir
    from geodml.data.partition import format_partition_table, make_partitioner, partition_report
    from geodml.metrics.sinks import ConsoleProgress, JsonlSink, MultiSink, Sink
    from geodml.models import build_model, count_parameters
    from geodml.runtime import (agree_on_out_dir, collective_device, destroy_process_group, init_process_group, resolve_backend,
                                seed_everything)
    from geodml.trainer import Trainer, steps_per_epoch

    wall_t0 = time.monotonic()
    startup = _Startup()  # per-rank start-up breakdown -> rank<k>/startup.json (docs/launch.md)
    torch.set_num_threads(cfg.threads)
    backend = resolve_backend(cfg.backend, env.local_world_size, cfg.device)
    rank, world = env.rank, env.world_size
    is0 = rank == 0
    comm = None
    exporter = None
    watch = None  # peer-failure heartbeats (geodml.peerwatch)
    sink: Sink = Sink()
    try:
        device = init_process_group(env, backend, cfg.comm.timeout_s, cfg.device)
        seed_everything(cfg.seed, rank)
        out = agree_on_out_dir(env, cfg.out, cfg.algo.algo)
        if world > 1 and env.under_torchrun:
            from geodml.peerwatch import PeerWatch
            watch = PeerWatch(rank=rank, world_size=world, timeout_s=cfg.reliability.peer_timeout_s).start()
        startup.lap("process_group_s")
        comm = build_comm(cfg.comm, rank=rank, world_size=world, device=collective_device(backend))
        startup.lap("zmq_mesh_s")
        if cfg.metrics_port:  # every rank's exporter; rank 0 writes the Prometheus file_sd targets
            from geodml.metrics.prometheus import file_sd_groups, start_rank_exporter
            exporter, targets = start_rank_exporter(comm, rank=rank, local_rank=env.local_rank, base_port=cfg.metrics_port,
                                                    host=cfg.metrics_host, run=out.name, algo=cfg.algo.algo, device=device)
            if is0:
                out.mkdir(parents=True, exist_ok=True)
                _write_json(out / "prometheus_targets.json",
                            file_sd_groups(targets, comm.region_of_rank, run=out.name, algo=cfg.algo.algo))
                print(f"metrics: Prometheus exporters at {', '.join(targets)} (file_sd: {out / 'prometheus_targets.json'})",
                      flush=True)
                if env.local_world_size < world and cfg.metrics_host.startswith(("127.", "localhost", "::1")):
                    print(f"metrics: warning: the job spans nodes but --metrics-host {cfg.metrics_host} is loopback: a "
                          f"Prometheus server reaches only its own node's exporters; use --metrics-host 0.0.0.0",
                          file=sys.stderr, flush=True)

        # Data: every rank computes ALL partitions from the seed and keeps its own.
        ds = load_dataset(cfg.data.dataset, cfg.data.data_dir, seed=cfg.seed,
                          cache_dir=resolve_cache_dir(cfg.data.cache))  # decoded once per machine, mapped by all
        labels = ds.train_y.numpy()
        parts = make_partitioner(cfg.data).split(labels, world, np.random.default_rng([cfg.seed, 0xDA7A]))
        report = partition_report(labels, parts, ds.num_classes)
        startup.lap("data_s")

        model = build_model(cfg.model.model, cfg.model.norm, ds.input_shape, ds.num_classes,
                            generator_seed=cfg.seed).to(device)
        flat = FlatParams(model)
        spe = steps_per_epoch(len(labels), world, cfg.optim.batch_size)
        total_steps = cfg.optim.steps or max(1, round(cfg.optim.epochs * spe))
        ctx = AlgoContext(rank=rank, world_size=world, seed=cfg.seed, steps_per_epoch=spe, total_steps=total_steps,
                          batch_size=cfg.optim.batch_size, label_counts=np.asarray(report["label_counts"], dtype=np.int64))
        algo = build_algorithm(cfg, flat=flat, comm=comm, ctx=ctx)
        from geodml.checkpoint import Checkpointer, find_resume_step, fingerprint, resume_requested, truncate_metrics
        fp = fingerprint(cfg, world)
        resume_step = find_resume_step(out, world, fp) if resume_requested(cfg) else None
        if len(set(comm.meta_all_gather_object(resume_step))) != 1:
            raise RuntimeError("ranks disagree on the checkpoint step to resume from (is --out on a shared file system?)")
        if is0 and resume_requested(cfg):  # the lines after the checkpoint are written again
            truncate_metrics(out / "metrics.jsonl", resume_step or 0)

        if is0:
            (out / f"rank{rank}").mkdir(parents=True, exist_ok=True)
            config_doc = {"version": __version__, "world_size": world, "backend": backend, "device": str(device), "config": cfg.to_dict(),
                          "region_of_rank": comm.region_of_rank, "parameters": count_parameters(model),
                          "steps_per_epoch": spe, "total_steps": total_steps,
                          "topology": getattr(getattr(comm, "topology", None), "to_dict", lambda: None)(),
                          "host": host_info()}
            _write_json(out / "config.json", config_doc)
            _write_json(out / "partitions.json", report)
            print(f"geodml {__version__}: {cfg.algo.algo} on {cfg.data.dataset}, K={world} partitions "
                  f"({cfg.data.partition}), {cfg.model.model}/{cfg.model.norm} with {count_parameters(model):,} "
                  f"parameters, {total_steps} steps ({spe}/epoch), backend {backend} on {device}, wan {cfg.comm.wan}")
            print(format_partition_table(report), flush=True)
            sinks: list[Sink] = [JsonlSink(out / "metrics.jsonl")]
            if cfg.progress:
                sinks.append(ConsoleProgress(total_steps))
            sink = MultiSink(sinks)
        (out / f"rank{rank}").mkdir(parents=True, exist_ok=True)

        train_x, train_y = ds.train_x.to(device), ds.train_y.to(device)
        skewscout = None
        if cfg.skewscout.enabled:
            from geodml.skewscout import ModelTraveler, SkewScout
            traveler = ModelTraveler(rank=rank, world_size=world, model=model, flat=flat, comm=comm,
                                     train_x=train_x, train_y=train_y, local_indices=parts[rank],
                                     samples=cfg.skewscout.travel_samples, seed=cfg.seed)
            skewscout = SkewScout(cfg=cfg.skewscout, algo=algo, traveler=traveler, comm=comm, rank=rank, world_size=world,
                                  model_bytes=flat.numel * flat.data.element_size(), seed=cfg.seed)
        if exporter is not None:
            sink = MultiSink([sink, exporter])  # every rank: the exporter keeps the last validation accuracy
        from geodml.peerwatch import fault_hook_from_env
        checkpointer = Checkpointer(out, rank=rank, world_size=world, every_steps=cfg.reliability.checkpoint_every,
                                    fp=fp, skewscout=skewscout)
        step_hooks = [h for h in (checkpointer, fault_hook_from_env(rank)) if h is not None]
        trainer = Trainer(rank=rank, world_size=world, model=model, flat=flat, algo=algo, comm=comm, optim=cfg.optim,
                          train_x=train_x, train_y=train_y, test_x=ds.test_x.to(device), test_y=ds.test_y.to(device), local_indices=parts[rank], seed=cfg.seed, total_steps=total_steps,
                          spe=spe, eval_every=cfg.eval_every, log_every=cfg.log_every, sink=sink, skewscout=skewscout,
                          step_hooks=step_hooks)
        if resume_step is not None:
            checkpointer.restore(trainer, resume_step)
            if is0:
                print(f"resumed from step {resume_step} (checkpoints in {out}/rank<k>/)", flush=True)
        if exporter is not None:  # read at scrape time, nothing per step
            exporter.watch(state=trainer.state, algo=algo, accuracy_loss=None if skewscout is None else
                           (lambda: float(skewscout.msg[0]) if skewscout.rounds else None))
        startup.lap("model_s")
        startup.done()
        result = trainer.run()
        sink.close()

        # Totals (uncharged bookkeeping) and the run directory.
        global_sd = trainer.global_state_dict()
        rows = [r for rank_rows in comm.meta_all_gather_object(comm.ledger.rows()) for r in rank_rows]
        emulated = max(comm.meta_all_gather_object(float(getattr(comm, "emulated_s", 0.0))))
        _save_torch(out / f"rank{rank}" / "model.pt", {k: v.detach().cpu() for k, v in model.state_dict().items()})
        _write_json(out / f"rank{rank}" / "startup.json", startup.report(rank=rank, local_rank=env.local_rank))
        if not is0:
            return None
        from geodml.comm.collectives import ring_allreduce_wan_bytes
        from geodml.comm.ledger import Ledger
        final = result["final"]
        totals = Ledger.summarize(rows)
        total_bytes = totals["wan_bytes_total"]
        bsp_bytes = trainer.state.step * ring_allreduce_wan_bytes(flat.numel, flat.data.element_size(), comm.region_of_rank)
        summary = {
            "algo": cfg.algo.algo,
            "final_val_accuracy": final["val_accuracy"],
            "final_model": "global" if algo.models_agree or algo.global_model_rank is not None else "average_of_weights",
            "per_rank_val_accuracy": result["per_rank_val_accuracy"],
            "per_rank_train_accuracy": result["per_rank_train_accuracy"],
            "final_val_loss": final["val_loss"],
            "final_train_loss": final["train_loss"],
            **totals,
            "emulated_seconds": emulated,
            "wall_seconds": time.monotonic() - wall_t0,
            "steps": trainer.state.step,
            "epochs": trainer.state.step / spe,
            # The WAN bytes BSP would have sent over the same steps on the same placement (one gradient
            # all-reduce per step under the ring cost model: what a BSP run's ledger records, tests/test_bsp.py).
            "bsp_equivalent_wan_bytes": bsp_bytes,
            "wan_savings_vs_bsp": (bsp_bytes / total_bytes) if total_bytes else None,
            "theta_final": algo.theta,
            "theta_name": algo.theta_name,
            **(skewscout.summary() if skewscout is not None else {}),
            "world_size": world,
            "dataset": cfg.data.dataset,
            "partition": cfg.data.partition,
            "skew": cfg.data.skew if cfg.data.partition == "label" else None,
            "model": f"{cfg.model.model}/{cfg.model.norm}",
        }
        _save_torch(out / "model.pt", global_sd)
        _write_json(out / "summary.json", summary)
        from geodml.metrics.sinks import human_bytes
        print(f"done: final val accuracy {summary['final_val_accuracy']:.4f} ({summary['final_model']} model; "
              f"per partition {', '.join(f'{a:.3f}' for a in summary['per_rank_val_accuracy'])}), "
              f"WAN bytes {human_bytes(summary['wan_bytes_total'])} ({summary['wan_bytes_total']:,} B), "
              f"emulated {summary['emulated_seconds']:.1f} s, wall {summary['wall_seconds']:.1f} s\n"
              f"{_vs_bsp_line(summary, world)}"
              f"run directory: {out}", flush=True)
        return summary
    finally:
        if watch is not None:  # a peer's death surfaces here as a comm error: let the watch name it
            failure = sys.exc_info()[1]
            if failure is not None:
                from geodml.peerwatch import looks_like_peer_loss
                if looks_like_peer_loss(failure):
                    watch.await_verdict()
                else:
                    watch.mark_failed()
            watch.stop(done=failure is None)
        sink.close()
        if exporter is not None:
            if sys.exc_info()[0] is None and cfg.metrics_linger_s > 0:  # linger only after a successful run
                if is0:
                    print(f"metrics: exporters stay up {cfg.metrics_linger_s:g} s (--metrics-linger) for the last scrape",
                          flush=True)
                time.sleep(cfg.metrics_linger_s)
            exporter.stop()
        if comm is not None:
            comm.close()
        destroy_process_group()
