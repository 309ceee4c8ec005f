"""The golden matrix: runs whose every output the engine must keep bit for bit.

Each cell is one geodml command on digits (P = 6 partitions unless the cell says otherwise), run
on each of its process counts R. Its golden record (``tests/golden/data/<cell>.json``) was written
by ``python -m tests.golden.record`` from commit c3a6901, before the one-engine change, and holds
what a run reports that does not depend on the clock: summary.json and config.json without their
measured fields, every metrics.jsonl line without ``wall_s`` and ``emulated_s`` (which add
measured compute seconds), partitions.json, and a digest of every tensor of every model file.

Every cell's runs on every R had to agree with each other already (the design's promise that R
does not change a result), so one record per cell serves every R; where today's main did not
agree (a field below), the record keeps each R's value and the test says why.

Runs are subprocesses with the CPU kernels pinned (``KERNEL_ENV``): torch's and oneDNN's to AVX2 and
MKL's to its COMPATIBLE branch, so that the records hold on any x86-64 machine with AVX2, Intel's or
AMD's, whatever its widest vector unit. History: the first records (MKL not pinned) held on the AVX-512
machine that wrote them and differed in the last bits of every loss on an AMX (Sapphire Rapids)
machine and in CI; the second (MKL_CBWR=AVX2, 2026-12-03) held on Intel machines but not on an AMD
EPYC, where MKL ignores the AVX2 branch (AVX2, AVX and no setting gave one result there, COMPATIBLE
another, the Intel record a third). Each time the records were rewritten from the same commit c3a6901
(its code, tests/golden as of 5af0a9e, with only KERNEL_ENV changed), and today's engine reproduces
them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KERNEL_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "COMPATIBLE",
              "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2", "GEODML_POISON_SCRATCH": "1"}
"""The environment of every golden run: torch's and oneDNN's kernels at AVX2, MKL's at COMPATIBLE (MKL_CBWR:
MKL's conditional numerical reproducibility; COMPATIBLE is the branch its documentation names for the
same results on Intel and non-Intel processors; without it MKL picks its code path by CPU model), one
thread; the engine's shared buffers poisoned at
every switch between hosted partitions (geodml.engine.worker), so a run that read one across a wait
would not match its record (the records were written without it: the engine before the change had no
shared buffers to poison)."""

BASE = ["--dataset", "digits", "--partitions", "6", "--steps", "30", "--wan", "virtual", "--no-progress",
        "--eval-every", "10", "--log-every", "5"]
"""Every cell's common flags (a cell's own flags come after, so they win)."""

MEASURED_SUMMARY = ("wall_seconds", "emulated_seconds", "wan_peak_bps_by_link", "peak_window_s")
"""summary.json fields that depend on the clock (emulated time adds measured compute seconds; the peak link
rates are bytes per window of that time, added after the records were made)."""
ADDED_SUMMARY = ("headline_val_accuracy", "headline_measure", "partition_mean_val_accuracy")
"""summary.json fields added after the records were made that derive from recorded ones (final_val_accuracy,
final_model, per_rank_val_accuracy; tests/test_headline.py checks the derivation)."""
MEASURED_METRICS = ("wall_s", "emulated_s")
"""metrics.jsonl fields that depend on the clock."""
MEASURED_CONFIG = ("engine", "host")
"""config.json fields that name the machine or the engine, not the run."""
ADDED_OPTIONS = {"plugin": None, "tensorboard": None, "fedavg.server_optimizer": "sgd",
                 "fedavg.server_betas": [0.9, 0.99], "fedavg.server_tau": 0.001, "comm.compute_s_per_step": None,
                 "compression.compress": "none", "compression.compress_rank": 1, "compression.compress_levels": 16,
                 "reliability.restart": False,
                 "skewscout.travel_backoff": 1}
"""Options added after the records were made (issue 66: a plugin's options, --tensorboard; issue 67: FedOpt's
server optimizer, --compute-s-per-step, --compress; issue 71: --restart; issue 69: --travel-backoff), with their
defaults, ``section.name`` for one inside a section: a run that leaves them there is compared without them (one
that does not keeps them, and differs)."""
REMOVED_OPTIONS = ("engine", "vmap", "partition_scores", "processes")
"""Options of the run configuration that the one-engine change removed (``--engine``, ``--vmap``): not
compared (they changed nothing in a run's results; the runs of the matrix left them at their defaults);
and ``--partition-scores``, added by it (tests/test_golden.py says what its default changes)."""


@dataclass(frozen=True)
class Cell:
    """One golden run: its flags and the process counts it runs on."""

    name: str
    argv: list[str]
    processes: tuple[int, ...] = (1,)
    suite: bool = False
    """Run in every suite run (the rest only under ``-m golden``)."""
    resume_at: int | None = None
    """Kill the run (every process) after this step with a checkpoint behind it, then resume it:
    the record is the resumed run's, and must equal the uninterrupted one."""
    env: dict[str, str] = field(default_factory=dict)

    @property
    def full_argv(self) -> list[str]:
        """BASE then the cell's flags (``--rounds`` replaces BASE's ``--steps``)."""
        base = list(BASE)
        if "--rounds" in self.argv:
            i = base.index("--steps")
            del base[i:i + 2]
        return [*base, *self.argv]


CELLS = [
    # ---- every algorithm, on R = 1, 2, 3, 6 where the engine's cross-process paths differ ----
    Cell("bsp", ["--algo", "bsp"], (1, 2, 3, 6), suite=True),
    Cell("bsp-batchnorm", ["--algo", "bsp", "--model", "lenet", "--norm", "batch"], (1, 2, 6), suite=True),
    Cell("bsp-batchrenorm", ["--algo", "bsp", "--model", "lenet", "--norm", "batchrenorm", "--brn-steps", "5,10,15"], (1, 2)),
    Cell("local", ["--algo", "local"], (1, 2), suite=True),
    Cell("gaia", ["--algo", "gaia", "--t0", "0.05", "--weight-decay", "0.001"], (1, 2, 3, 6), suite=True),
    Cell("gaia-dense-lenet-mults", ["--algo", "gaia", "--t0", "0", "--model", "lenet", "--param-mults", "prototxt",
                                    "--weight-decay", "0.004", "--lr-schedule", "poly"], (1, 2)),
    Cell("gaia-skewscout", ["--algo", "gaia", "--t0", "0.05", "--skewscout", "--travel-every", "10"], (1, 2, 6),
         suite=True),
    Cell("gaia-groupnorm", ["--algo", "gaia", "--t0", "0.1", "--model", "lenet", "--norm", "group", "--gn-groups", "2"],
         (1, 3)),
    Cell("dgc", ["--algo", "dgc", "--e-warm", "0.3"], (1, 2, 3, 6), suite=True),
    Cell("dgc-layer-clip", ["--algo", "dgc", "--e-warm", "0", "--sparsity", "0.3", "--dgc-scope", "layer",
                            "--clip-norm", "0.5", "--dgc-clip-at", "update"], (1, 2)),
    Cell("dgc-skewscout", ["--algo", "dgc", "--e-warm", "0.3", "--skewscout", "--travel-every", "10"], (1,)),
    # ---- FedAvg and its variants ----
    Cell("fedavg", ["--algo", "fedavg", "--iter-local", "5", "--weight-decay", "0.001"], (1, 2, 3, 6), suite=True),
    Cell("fedavg-sampled-fedavgm-fedprox", ["--algo", "fedavg", "--iter-local", "5", "--client-fraction", "0.5",
                                            "--server-momentum", "0.9", "--server-nesterov", "--prox-mu", "0.1",
                                            "--eval-every", "7", "--log-every", "3"], (1, 2, 3, 6), suite=True),
    Cell("fedavg-reset-partial", ["--algo", "fedavg", "--iter-local", "5", "--reset-momentum", "--steps", "28"], (1, 2),
         suite=True),
    Cell("fedavg-batchnorm-sampled", ["--algo", "fedavg", "--iter-local", "5", "--client-fraction", "0.5",
                                      "--model", "lenet", "--norm", "batch"], (1, 2), suite=True),
    Cell("fedir-fedvc-fedavgm", ["--algo", "fedavg", "--iter-local", "5", "--client-fraction", "0.5",
                                 "--server-momentum", "0.9", "--fedir", "--virtual-client-size", "200",
                                 "--partition", "dirichlet", "--alpha", "0.5"], (1, 2), suite=True),
    Cell("iwds-reweight", ["--algo", "fedavg", "--iter-local", "5", "--iwds", "0.9,0.1,0.5", "--partition", "label",
                           "--skew", "0.8"], (1, 2), suite=True),
    Cell("iwds-resample-sampled", ["--algo", "fedavg", "--iter-local", "5", "--iwds", "0.9,0.1,0.5", "--iwds-mode",
                                   "resample", "--client-fraction", "0.5", "--partition", "label", "--skew", "0.8"],
         (1, 3)),
    Cell("fednova-local-epochs", ["--algo", "fedavg", "--fednova", "--local-epochs", "0.2", "--partition", "dirichlet",
                                  "--alpha", "0.3", "--rounds", "4", "--eval-every-rounds", "1", "--eval-every",
                                  "1000"], (1, 2), suite=True),
    Cell("fedavg-skewscout", ["--algo", "fedavg", "--iter-local", "5", "--skewscout", "--travel-every", "10"], (1,)),
    Cell("fedavg-100-clients", ["--algo", "fedavg", "--partitions", "100", "--iter-local", "5", "--client-fraction",
                                "0.1", "--steps", "40", "--eval-every", "20", "--partition", "dirichlet", "--alpha",
                                "0.5", "--reset-momentum"], (1, 2), suite=True),
    # ---- run features ----
    Cell("fedavg-eval-features", ["--algo", "fedavg", "--iter-local", "5", "--client-fraction", "0.5", "--eval-at",
                                  "3,17", "--partition-eval-examples", "300", "--channels-last", "--model", "lenet"],
         (1, 2)),
    Cell("gaia-divergence", ["--algo", "gaia", "--t0", "0.05", "--lr", "3", "--divergence-loss", "5"], (1, 2)),
    Cell("bsp-resume", ["--algo", "bsp", "--checkpoint-every", "10"], (1, 2), resume_at=15, suite=True),
    Cell("fedavg-sampled-resume", ["--algo", "fedavg", "--iter-local", "5", "--client-fraction", "0.5",
                                   "--checkpoint-every", "10"], (1, 2), resume_at=12),
    Cell("gaia-resume", ["--algo", "gaia", "--t0", "0.05", "--checkpoint-every", "10"], (1, 3), resume_at=15),
    Cell("gaia-wan-real", ["--algo", "gaia", "--t0", "0.05", "--wan", "real", "--wan-scale", "1000", "--steps", "10"],
         (1, 2)),
]

BY_NAME = {c.name: c for c in CELLS}
assert len(BY_NAME) == len(CELLS), "cell names are unique"
