"""Prometheus exporter: one HTTP endpoint per rank (docs/design.md "Metric names").

Every rank serves ``/metrics`` on ``--metrics-host:--metrics-port + local rank`` from its own
:class:`prometheus_client.CollectorRegistry` (never the global one). Nothing is computed per
step: a custom collector reads the live sources when Prometheus scrapes --

* the Comm ledger's rows (``comm.ledger.rows()``: bytes, messages and emulated link seconds
  per (src_region, dst_region, kind) this rank sent) and this rank's emulated clock,
* the trainer's state (steps done, this rank's own mean training loss of the last log interval),
* the algorithm's knob (``theta``, labelled with its name: t0, iter_local, e_warm),
* SkewScout's accuracy loss as this rank measured it (when SkewScout runs),
* the last validation accuracy of the global model (every rank logs it: the trainer's
  evaluation is collective), received through the ordinary :class:`Sink` interface,
* the ZeroMQ messages this rank dropped, by reason (``Comm.wire_rejected``; wire security),
* process CPU seconds and resident memory (psutil), GPU memory when the rank uses CUDA.

Metric names and their labels are :data:`METRICS` (one table; the Grafana dashboard test checks
against it). Every sample carries ``rank``, ``region``, ``algo`` and ``run`` (the run
directory's name). Link metrics add ``src_region``, ``dst_region``, ``kind``; ``geodml_wan_*``
counts only traffic between two different regions (so ``sum(geodml_wan_sent_bytes_total)``
equals summary.json's ``wan_bytes_total``) and ``geodml_lan_sent_bytes_total`` the traffic inside
one region (``lan_bytes_total``). A value that does not exist yet (no evaluation so far, no
SkewScout round) is absent, not zero.

**Many partitions per process** (``--partitions P`` over R processes): one exporter per
process (port ``--metrics-port`` + the process's local index) serves its hosted partitions.
With P <= :data:`PARTITION_LABEL_LIMIT` every partition keeps its own samples, labelled
``rank=<partition>`` as above. Above it, a process's partitions are summed per region and
labelled ``rank="p<process>"``: counters summed, the emulated clock and steps their maximum, the
training loss and SkewScout's accuracy loss their mean. The limit is the series count: a partition
exports about (regions it sends to) x (kinds) x 4 link series plus 8 (about 70 with 5 regions and
Gaia's kinds), so 100 partitions are some 7,000 series per scrape, and 10,000 partitions would be
700,000, more than one scrape every few seconds should carry and than a dashboard can sum
interactively; per region a process exports at most regions x (regions x kinds x 4 + 8) series
whatever P is. Process metrics (CPU, memory, GPU, dropped ZeroMQ messages: one transport per
process) appear once per exporter, labelled as its first partition or region.

:func:`start_rank_exporter` starts the exporters of all ranks together (a collective): when
any rank cannot listen, every rank raises the same error naming the ranks and ports, so a
busy port never leaves half a job waiting. :func:`file_sd_groups` is the Prometheus file_sd
targets document the run writes as ``prometheus_targets.json``.
"""

from __future__ import annotations

import errno
import math
import socket
import sys
import threading
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from geodml.comm.ledger import Ledger
from geodml.metrics.sinks import Sink

if TYPE_CHECKING:
    from geodml.algorithms.base import Algorithm
    from geodml.comm.api import RunComm
    from geodml.trainer import TrainState

COMMON_LABELS = ("rank", "region", "algo", "run")
LINK_LABELS = COMMON_LABELS + ("src_region", "dst_region", "kind")

# name -> (type, label names, help). Prometheus conventions: base units, counters end in _total.
METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "geodml_wan_sent_bytes_total": (
        "counter", LINK_LABELS, "Bytes this rank sent to another region, by link and traffic kind (the Comm ledger)."),
    "geodml_wan_messages_total": (
        "counter", LINK_LABELS, "Messages this rank sent to another region, by link and traffic kind."),
    "geodml_wan_emulated_seconds_total": (
        "counter", LINK_LABELS, "Emulated link seconds (latency + bytes/bandwidth of each message) this rank used, "
        "by link and kind; 0 under --wan off."),
    "geodml_lan_sent_bytes_total": (
        "counter", LINK_LABELS, "Bytes this rank sent inside its own region (LAN), by kind."),
    "geodml_wan_peak_bits_per_second": (
        "gauge", COMMON_LABELS + ("src_region", "dst_region"), "The most bits this rank (or this label set's "
        "partitions together) put on a WAN link in one window of emulated time (geodml.comm.ledger.PEAK_WINDOW_S, "
        "1 s), over the window; timed runs only (--wan virtual / real)."),
    "geodml_emulated_time_seconds": (
        "gauge", COMMON_LABELS, "This rank's emulated clock: measured compute plus modelled communication."),
    "geodml_steps_total": ("counter", COMMON_LABELS, "Training steps this rank has done."),
    "geodml_train_loss": (
        "gauge", COMMON_LABELS, "This rank's own mean training loss over the last log interval."),
    "geodml_validation_accuracy": (
        "gauge", COMMON_LABELS, "Accuracy of the global model on the whole test set at the last evaluation "
        "(the same on every rank)."),
    "geodml_skewscout_accuracy_loss": (
        "gauge", COMMON_LABELS, "SkewScout: accuracy loss this rank measured at the last model-traveling round."),
    "geodml_skewscout_theta": (
        "gauge", COMMON_LABELS + ("param",), "The algorithm's communication knob (SkewScout's theta); "
        "param names it (t0, iter_local, e_warm)."),
    "geodml_wire_rejected_messages_total": (
        "counter", COMMON_LABELS + ("reason",), "ZeroMQ messages this rank received and dropped unapplied, by reason "
        "(oversized, malformed, unauthenticated, wrong_type, unknown_peer, replayed; docs/reliability.md)."),
    "geodml_process_cpu_seconds_total": ("counter", COMMON_LABELS, "User plus system CPU seconds of this rank's process."),
    "geodml_process_resident_memory_bytes": ("gauge", COMMON_LABELS, "Resident set size of this rank's process."),
    "geodml_gpu_memory_allocated_bytes": (
        "gauge", COMMON_LABELS, "CUDA memory held by tensors of this rank (only when the rank uses a GPU)."),
    "geodml_gpu_memory_reserved_bytes": (
        "gauge", COMMON_LABELS, "CUDA memory reserved by this rank's caching allocator (only when the rank uses a GPU)."),
}

_LINK_VALUES = (("geodml_wan_sent_bytes_total", "bytes"), ("geodml_wan_messages_total", "messages"),
                ("geodml_wan_emulated_seconds_total", "emulated_s"))

PARTITION_LABEL_LIMIT = 100
"""Runs with at most this many partitions label samples by partition; larger ones by process and
region (module docstring: the series count)."""


class MetricsError(RuntimeError):
    """An exporter could not start (port in use, address not available, ...)."""


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


class _Collector:
    """Reads the exporter's sources at scrape time (prometheus_client's custom-collector protocol)."""

    def __init__(self, exporter: "RankExporter") -> None:
        self.x = exporter

    def describe(self):  # no samples at registration time (nothing is read before the first scrape)
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        x = self.x
        fams = {}
        for name, (kind, labels, doc) in METRICS.items():
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            fams[name] = cls(name, doc, labels=list(labels))
        groups = x.groups()
        for labels, sources in groups:
            self._partitions(fams, [labels[k] for k in COMMON_LABELS], sources)
        if groups:
            self._process(fams, [groups[0][0][k] for k in COMMON_LABELS])
        # families with no sample are still described (HELP/TYPE): Prometheus ignores them
        return list(fams.values())

    def _partitions(self, fams: dict, common: list[str], sources: list["PartitionSource"]) -> None:
        """One label set's samples: one partition's, or the sum of a process's partitions of one region."""
        x = self.x
        links: dict[tuple[str, str, str], list[float]] = {}
        for src in sources:
            for row in x._read(src.ledger_rows, []):
                acc = links.setdefault((row["src_region"], row["dst_region"], row["kind"]), [0.0, 0.0, 0.0])
                for i, key in enumerate(("bytes", "messages", "emulated_s")):
                    acc[i] += float(row.get(key, 0))
        for link, acc in links.items():
            if link[0] != link[1]:
                for (name, _), value in zip(_LINK_VALUES, acc):
                    fams[name].add_metric(common + list(link), value)
            else:
                fams["geodml_lan_sent_bytes_total"].add_metric(common + list(link), acc[0])
        windows = [x._read(src.ledger_windows, {}) for src in sources if src.ledger_windows is not None]
        for name, bps in Ledger.peaks(windows).items():
            fams["geodml_wan_peak_bits_per_second"].add_metric(common + name.split("->"), bps)

        def put(name: str, values: list[Any], how: Callable[[list[float]], float], extra: list[str] | None = None) -> None:
            finite = [float(v) for v in values if _finite(v)]
            if finite:
                fams[name].add_metric(common + (extra or []), how(finite))

        def mean(v: list[float]) -> float:
            return sum(v) / len(v)

        put("geodml_emulated_time_seconds", [x._read(s.emulated_s) for s in sources], max)
        put("geodml_steps_total", [s.state.step if s.state is not None else 0 for s in sources], max)
        put("geodml_train_loss", [s.state.local_train_loss for s in sources if s.state is not None], mean)
        put("geodml_validation_accuracy", [s.values.get("validation_accuracy") for s in sources], max)
        put("geodml_skewscout_accuracy_loss",
            [x._read(s.accuracy_loss) if s.accuracy_loss is not None else s.values.get("skewscout_accuracy_loss")
             for s in sources], mean)
        knob = next((s.algo.knob for s in sources if s.algo is not None and s.algo.knob is not None), None)
        if knob is not None:
            put("geodml_skewscout_theta", [x._read(knob.get)], max, [str(knob.name)])

    def _process(self, fams: dict, common: list[str]) -> None:
        """This process's own samples, once per exporter."""
        x = self.x

        def put(name: str, value: Any, extra: list[str] | None = None) -> None:
            if _finite(value):
                fams[name].add_metric(common + (extra or []), float(value))

        for reason, count in (x._read(x.wire_rejected, {}) or {}).items():
            put("geodml_wire_rejected_messages_total", count, [reason])
        proc = x._proc
        if proc is not None:
            cpu = x._read(proc.cpu_times)
            if cpu is not None:
                put("geodml_process_cpu_seconds_total", cpu.user + cpu.system)
            mem = x._read(proc.memory_info)
            if mem is not None:
                put("geodml_process_resident_memory_bytes", mem.rss)
        dev = x.device
        if dev is not None and getattr(dev, "type", None) == "cuda":
            import torch
            put("geodml_gpu_memory_allocated_bytes", x._read(lambda: torch.cuda.memory_allocated(dev)))
            put("geodml_gpu_memory_reserved_bytes", x._read(lambda: torch.cuda.memory_reserved(dev)))


class _SilentHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # no access log on the run's stderr
        pass


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scraper never keeps the process alive


class PartitionSource(Sink):
    """What one partition exports: its labels and readers of its live state; also a :class:`Sink`
    (it keeps the last validation accuracy it sees).

    Sources may be attached later with :meth:`watch` (the trainer is built after the exporter
    starts); until then only the ledger and the clock have samples.
    """

    def __init__(self, *, labels: dict[str, Any], ledger_rows: Callable[[], list[dict]] | None = None,
                 emulated_s: Callable[[], float] | None = None,
                 ledger_windows: Callable[[], dict[str, dict[int, float]]] | None = None) -> None:
        missing = [k for k in COMMON_LABELS if k not in labels]
        assert not missing, f"exporter labels lack {missing}"
        self.labels = {k: str(v) for k, v in labels.items()}
        self.ledger_rows = ledger_rows
        self.ledger_windows = ledger_windows
        self.emulated_s = emulated_s
        self.state: TrainState | None = None
        self.algo: Algorithm | None = None
        self.accuracy_loss: Callable[[], float | None] | None = None
        self.values: dict[str, float] = {}

    def watch(self, *, state: TrainState | None = None, algo: Algorithm | None = None,
              accuracy_loss: Callable[[], float | None] | None = None) -> None:
        """Attach the trainer's state (``step``, ``local_train_loss``), the algorithm (its
        ``knob``: name and value) and SkewScout's per-rank accuracy loss (a callable; None = not measured)."""
        if state is not None:
            self.state = state
        if algo is not None:
            self.algo = algo
        if accuracy_loss is not None:
            self.accuracy_loss = accuracy_loss

    def log(self, record: dict) -> None:
        """Sink interface: keep the last validation accuracy (and SkewScout's mean accuracy loss
        when no per-rank source is attached)."""
        if _finite(record.get("val_accuracy")):
            self.values["validation_accuracy"] = float(record["val_accuracy"])
        if _finite(record.get("accuracy_loss")):
            self.values["skewscout_accuracy_loss"] = float(record["accuracy_loss"])


class RankExporter(Sink):
    """One process's exporter: one HTTP endpoint for the partitions it hosts.

    Built with ``labels`` it exports one partition (one partition per process), and its
    :meth:`watch` and :meth:`log` are that partition's. Built without, it hosts partitions added
    with :meth:`add_partition`; ``group_by_region`` (the process's index) sums them per region
    (module docstring). ``close()`` (the Sink end) does nothing: the HTTP server stops with
    :meth:`stop`, after the run's linger, so Prometheus can scrape the final values.
    """

    def __init__(self, *, labels: dict[str, Any] | None = None, ledger_rows: Callable[[], list[dict]] | None = None,
                 emulated_s: Callable[[], float] | None = None, device: Any = None,
                 wire_rejected: Callable[[], dict[str, int]] | None = None,
                 group_by_region: int | None = None,
                 ledger_windows: Callable[[], dict[str, dict[int, float]]] | None = None) -> None:
        self.sources: list[PartitionSource] = []
        if labels is not None:
            self.sources.append(PartitionSource(labels=labels, ledger_rows=ledger_rows, emulated_s=emulated_s,
                                                ledger_windows=ledger_windows))
        self.wire_rejected = wire_rejected  # reason -> dropped ZeroMQ messages (Comm.wire_rejected)
        self.device = device
        self.group_by_region = group_by_region
        self.address: str | None = None
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._warned: set[str] = set()
        try:
            import psutil
            self._proc = psutil.Process()
        except Exception:  # psutil missing or refused: no process metrics, never a failed run
            self._proc = None
        from prometheus_client import CollectorRegistry
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    # ---- sources -----------------------------------------------------------------------
    def add_partition(self, *, labels: dict[str, Any], ledger_rows: Callable[[], list[dict]] | None = None,
                      emulated_s: Callable[[], float] | None = None,
                      ledger_windows: Callable[[], dict[str, dict[int, float]]] | None = None) -> PartitionSource:
        """A hosted partition's source (its ``watch`` and Sink ``log`` are the partition's own)."""
        src = PartitionSource(labels=labels, ledger_rows=ledger_rows, emulated_s=emulated_s,
                              ledger_windows=ledger_windows)
        self.sources.append(src)
        return src

    def groups(self) -> list[tuple[dict[str, str], list[PartitionSource]]]:
        """The label sets this exporter serves and the partitions behind each."""
        sources = list(self.sources)  # partitions may still be added while Prometheus scrapes
        if self.group_by_region is None:
            return [(s.labels, [s]) for s in sources]
        by_region: dict[str, list[PartitionSource]] = {}
        for s in sources:
            by_region.setdefault(s.labels["region"], []).append(s)
        return [({**members[0].labels, "rank": f"p{self.group_by_region}"}, members)
                for members in by_region.values()]

    def watch(self, **sources: Any) -> None:
        """The one partition's :meth:`PartitionSource.watch` (an exporter built with ``labels``)."""
        self.sources[0].watch(**sources)

    def log(self, record: dict) -> None:
        for src in self.sources:
            src.log(record)

    def _read(self, fn: Callable[[], Any] | None, default: Any = None) -> Any:
        """Call a source; a failing source costs its samples, never the scrape or the run."""
        if fn is None:
            return default
        for attempt in range(3):
            try:
                return fn()
            except Exception as exc:
                if isinstance(exc, RuntimeError) and attempt < 2:
                    continue  # e.g. the ledger's dict grew while this thread iterated it: read again
                name = getattr(fn, "__qualname__", repr(fn))
                if name not in self._warned:
                    self._warned.add(name)
                    print(f"geodml: warning: metrics source {name} failed ({exc!r}); its samples are left out",
                          file=sys.stderr)
                return default
        return default

    def exposition(self) -> bytes:
        """The text Prometheus would scrape now (tests, debugging)."""
        from prometheus_client import generate_latest
        return generate_latest(self.registry)

    # ---- server ------------------------------------------------------------------------
    def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` in a daemon thread. Raises :class:`MetricsError` (why, and what to do)."""
        from prometheus_client import make_wsgi_app
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        except socket.gaierror as exc:
            raise MetricsError(f"--metrics-host {host!r} cannot be resolved ({exc.strerror})") from None
        server_cls = type("_Server", (_ThreadingWSGIServer,), {"address_family": family})
        try:
            server = make_server(host, port, make_wsgi_app(self.registry), server_class=server_cls,
                                 handler_class=_SilentHandler)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                why = "address already in use (another run or program holds it)"
            elif exc.errno == errno.EADDRNOTAVAIL:
                why = "address not available on this host"
            elif exc.errno == errno.EACCES:
                why = "permission denied (ports below 1024 need root)"
            else:
                why = exc.strerror or str(exc)
            raise MetricsError(f"cannot listen on {host}:{port}: {why}") from None
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=f"geodml-metrics-{port}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving (idempotent, bounded: never hangs the run's exit)."""
        server, self._server = self._server, None
        if server is None:
            return
        stopper = threading.Thread(target=server.shutdown, daemon=True)
        stopper.start()
        stopper.join(timeout_s)
        try:
            server.server_close()
        except OSError:
            pass


def advertised_host(host: str) -> str:
    """The address other hosts use to scrape an exporter bound to ``host`` (hostname for wildcards)."""
    if host in ("0.0.0.0", "::", ""):
        return socket.gethostname()
    return host


def _target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def start_rank_exporter(comm: RunComm, *, rank: int, local_rank: int, base_port: int, host: str, run: str, algo: str,
                        device: Any = None) -> tuple[RankExporter, list[str]]:
    """Start this rank's exporter on ``base_port + local_rank``; collective over ``comm`` (uncharged).

    Returns the exporter and every rank's ``host:port`` target (index = rank). If any rank fails,
    every rank stops its own server and raises :class:`MetricsError` listing the failures.
    """
    region = comm.region_of_rank[rank]
    exporter = RankExporter(labels={"rank": rank, "region": region, "algo": algo, "run": run},
                            ledger_rows=comm.ledger.rows, emulated_s=lambda: float(comm.emulated_s), device=device,
                            wire_rejected=comm.wire_rejected, ledger_windows=comm.ledger.window_bytes)
    targets = start_together(exporter, comm.meta_all_gather_object, who=f"rank {rank}", index=rank,
                             local_index=local_rank, base_port=base_port, host=host)
    return exporter, targets


def start_together(exporter: RankExporter, all_gather: Callable[[Any], list[Any]], *, who: str, index: int,
                   local_index: int, base_port: int, host: str) -> list[str]:
    """Start ``exporter`` on ``base_port + local_index``, together with its peers (``all_gather``
    over them; ``index`` is this one's place in it): every target, or every peer raises the same
    :class:`MetricsError` naming each that failed."""
    port = base_port + local_index
    error = None
    try:
        exporter.start(host, port)
    except MetricsError as exc:
        error = f"{who} (port {base_port} + local rank {local_index}): {exc}"
    results = all_gather((error, _target(advertised_host(host), port)))
    errors = [e for e, _ in results if e]
    if errors:
        exporter.stop()
        raise MetricsError("Prometheus exporter: " + "; ".join(errors) +
                           ". Choose another --metrics-port (each node uses ports BASE..BASE+ranks-1) "
                           "or --metrics-port 0 to run without exporters.")
    exporter.address = results[index][1]
    return [t for _, t in results]


def file_sd_groups(targets: Iterable[str], region_of_rank: list[str], *, run: str, algo: str) -> list[dict]:
    """Prometheus file_sd document: one target group per rank, labelled run/algo/rank/region.

    The same labels are on every sample; the scrape config sets ``honor_labels: true`` so the
    exporter's own values stay authoritative.
    """
    return [{"targets": [t], "labels": {"run": run, "algo": algo, "rank": str(r), "region": region_of_rank[r]}}
            for r, t in enumerate(targets)]


def process_sd_groups(targets: Iterable[str], *, run: str, algo: str) -> list[dict]:
    """file_sd document of a run whose processes host several partitions: one target group per
    process, labelled run/algo/process (the samples carry rank and region themselves)."""
    return [{"targets": [t], "labels": {"run": run, "algo": algo, "process": str(i)}} for i, t in enumerate(targets)]
