"""Transport benchmark: geodml's ZeroMQ peer transport against raw pyzmq, and ``--wan real`` pacing.

Two processes on loopback TCP (this one is rank 0 and sends, a spawned child is rank 1 and
receives), measured side by side in one run:

1. Throughput of ~1 MB sparse-update messages (125,000 int32 indices + 125,000 float32
   values = 1,000,000 B) streamed through ``Comm.send``/``Comm.recv`` (``--wan off``: envelope,
   zero-copy frames, ledger) vs raw ``PUSH.send_multipart(copy=False)`` of the same two
   buffers, which returns before ZeroMQ has read them (so the caller may not overwrite them).
   Two geodml rows: ``send()`` returns only once ZeroMQ has released the buffers (safe to
   overwrite, the default), and ``send(wait=False)`` + one ``flush()`` at the end; each with
   wire authentication on (the default: SHA-256 of the arrays + keyed BLAKE2b tag, checked by
   the receiver before anything is parsed) and off (``--wire-auth off``). Target:
   geodml >= 0.8x that plain raw send. Raw pyzmq with ``send()``'s guarantee is measured too,
   as the fair baseline for ``send()``: ``copy=False, track=True`` and waiting on each
   message's tracker, and ``copy=True`` (ZeroMQ copies; the buffers are free at once). Time
   from the first send until the receiver's acknowledgement of the last message; methods
   interleaved in a fresh random order every round (the same on both processes), each after a
   short pause so that no method inherits the previous one's background work (pyzmq frees
   zero-copy frames in a thread of its own); ratios are medians of the per-round ratios.
2. Round trip of an 8-byte message (ping-pong), geodml (auth on and off) vs raw; median and p99.
3. ``--wan real`` pacing at each configured bandwidth (default 1, 10, 100, 1000 Mbit/s, 10 ms
   latency): the sender streams messages worth ``--pacing-seconds`` of link time; the
   receiver computes the achieved rate from the arrival times of messages 2..N (wire bytes,
   envelope included, as the link model counts them). Target: within 2% of configured. Then
   spaced probe messages carry their send time: latency error = arrival - send -
   ``transfer_s(bytes)``. Target: median within 0.5 ms. For reference the same spaced
   probes are sent through raw pyzmq without pacing: their one-way time is the part of the
   error that is loopback delivery to an idle process, not pacing.

Both processes run one torch thread; nothing else should load the machine while it runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import multiprocessing
import random
import secrets
import statistics
import time

import numpy as np
import zmq

SPARSE_ELEMENTS = 125_000  # int32 + float32 -> 1,000,000 B per message


def _float_list(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers like 1,10,100, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"rates must be positive, got {text!r}")
    return vals


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m geodml.bench transport", description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=200, help="1 MB messages per method and round (default 200)")
    p.add_argument("--rounds", type=int, default=21, help="interleaved rounds; medians are reported (default 21)")
    p.add_argument("--round-trips", type=int, default=2000, help="8 B ping-pongs per method (default 2000)")
    p.add_argument("--rates-mbps", type=_float_list, default=[1.0, 10.0, 100.0, 1000.0],
                   help="--wan real bandwidths to check, Mbit/s (default 1,10,100,1000)")
    p.add_argument("--latency-ms", type=float, default=10.0, help="one-way latency of the paced link (default 10)")
    p.add_argument("--pacing-seconds", type=float, default=1.0, help="link time streamed per rate (default 1.0)")
    p.add_argument("--probes", type=int, default=40, help="latency probes per rate (default 40)")
    p.add_argument("--quick", action="store_true", help="small sizes for a smoke test (numbers are noisy)")
    p.add_argument("--json", help="also write the results to this JSON file")
    return p


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.quick:
        # 0.5 s of link time per rate: the achieved rate is timed between receive times, and one late read of
        # the first message on a loaded machine skewed the former 0.15 s window by half (15 Mbit/s at 10).
        a.messages, a.rounds, a.round_trips, a.pacing_seconds, a.probes = 40, 2, 200, 0.5, 8
    opts = {k: v for k, v in vars(a).items() if k != "json"}
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=120)
    store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=timeout, wait_for_workers=False)
    child = multiprocessing.get_context("spawn").Process(target=_peer_main, args=(store.port, opts), daemon=True)
    child.start()
    try:
        results = _run(0, store, opts)
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
            child.join(timeout=10)
    if child.exitcode != 0:
        print(f"the receiving process failed (exit code {child.exitcode})")
        return 1
    print(format_table(results))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def _peer_main(port: int, opts: dict) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=120))
    _run(1, store, opts)


class _Sync:
    """A raw ZeroMQ ping-pong used to line both processes up before each timed block."""

    def __init__(self, push: zmq.Socket, pull: zmq.Socket, rank: int) -> None:
        self.push, self.pull, self.rank = push, pull, rank

    def __call__(self) -> None:
        if self.rank == 0:
            self.push.send(b"ready?")
            _recv_or_fail(self.pull)
        else:
            _recv_or_fail(self.pull)
            self.push.send(b"ready")


def _recv_or_fail(sock: zmq.Socket, *, copy: bool = True):
    if not sock.poll(60_000):
        raise TimeoutError("benchmark peer did not answer within 60 s")
    return sock.recv_multipart(copy=copy)


def _run(rank: int, store, opts: dict) -> dict:
    import torch

    from geodml.comm.dist import DistComm
    from geodml.comm.topology import topology_from_dict
    from geodml.comm.transport import PeerTransport
    from geodml.comm.wire import envelope_nbytes

    torch.set_num_threads(1)
    peer = 1 - rank
    regions = ["a", "b"]
    zctx = zmq.Context()
    raw_pull = zctx.socket(zmq.PULL)
    raw_port = raw_pull.bind_to_random_port("tcp://127.0.0.1")
    store.set(f"bench/raw/{rank}", str(raw_port))
    store.wait([f"bench/raw/{peer}"])
    raw_push = zctx.socket(zmq.PUSH)
    raw_push.connect(f"tcp://127.0.0.1:{store.get(f'bench/raw/{peer}').decode()}")
    sync = _Sync(raw_push, raw_pull, rank)

    def topo(rate_mbps: float, latency_ms: float):
        return topology_from_dict({"source": "benchmark (illustrative)", "regions": regions, "placement": regions,
                                   "default": {"bandwidth_mbps": rate_mbps, "latency_ms": latency_ms}})

    # The benchmark's own wire secret, through its own loopback store (a run broadcasts it over the
    # process group instead: geodml.comm.share_wire_secret).
    if rank == 0:
        store.set("bench/secret", secrets.token_bytes(32).hex())
    secret = bytes.fromhex(store.get("bench/secret").decode())
    plain = PeerTransport(rank=rank, world_size=2, store=store, bind_host="127.0.0.1", timeout_s=60, secret=secret,
                          region_of_rank=regions)
    noauth = PeerTransport(rank=rank, world_size=2, store=store, bind_host="127.0.0.1", timeout_s=60,
                           region_of_rank=regions, wire_auth="off")
    paced = None  # built after the throughput and round-trip phases, so that it is idle then
    results: dict = {"messages": opts["messages"], "rounds": opts["rounds"]}
    try:
        off = DistComm(rank=rank, world_size=2, region_of_rank=regions, topology=topo(100.0, 0.0), wan="off",
                       transport=plain)
        off_noauth = DistComm(rank=rank, world_size=2, region_of_rank=regions, topology=topo(100.0, 0.0),
                              wan="off", transport=noauth)
        comms = {"geodml": off, "geodml-nowait": off, "geodml-noauth": off_noauth, "geodml-nowait-noauth": off_noauth}
        idx = np.arange(SPARSE_ELEMENTS, dtype=np.int32)
        val = np.random.default_rng(0).random(SPARSE_ELEMENTS, dtype=np.float32)
        payload = idx.nbytes + val.nbytes
        n = opts["messages"]
        methods = ("geodml", "geodml-nowait", "geodml-noauth", "geodml-nowait-noauth", "raw", "raw-tracked", "raw-copy")
        tput: dict[str, list[float]] = {m: [] for m in methods}
        step = 0
        ack = np.zeros(1, dtype=np.int64)
        for rnd in range(opts["rounds"]):
            # A new order every round, so that load drifts hit every method alike.
            for method in random.Random(rnd).sample(methods, len(methods)):
                time.sleep(0.02)
                sync()
                if rank == 0:
                    t0 = time.perf_counter()
                    if method == "raw":
                        for _ in range(n):
                            raw_push.send_multipart([idx, val], copy=False)
                        _recv_or_fail(raw_pull)
                    elif method == "raw-tracked":
                        for _ in range(n):
                            raw_push.send_multipart([idx, val], copy=False, track=True).wait()
                        _recv_or_fail(raw_pull)
                    elif method == "raw-copy":
                        for _ in range(n):
                            raw_push.send_multipart([idx, val], copy=True)
                        _recv_or_fail(raw_pull)
                    else:
                        c = comms[method]
                        wait = "nowait" not in method
                        for i in range(n):
                            c.send(1, "update", [idx, val], step=step + i, wait=wait)
                        c.flush()
                        c.recv(1, "control", step=step)
                    tput[method].append(n * payload / (time.perf_counter() - t0))
                else:
                    if method.startswith("raw"):
                        for _ in range(n):
                            got = _recv_or_fail(raw_pull, copy=False)
                        assert len(got[0].buffer) == idx.nbytes
                        raw_push.send(b"ack")
                    else:
                        c = comms[method]
                        for i in range(n):
                            got = c.recv(0, "update", step=step + i)
                        assert got[0][-1] == SPARSE_ELEMENTS - 1 and got[1].dtype == np.float32
                        c.send(0, "control", [ack], step=step)
                step += n
        if rank == 0:
            results["throughput_bytes_per_s"] = {m: statistics.median(v) for m, v in tput.items()}
            results["throughput_ratio_to_raw"] = {
                m: statistics.median(a / b for a, b in zip(tput[m], tput["raw"])) for m in methods if m != "raw"}
            if opts["rounds"] >= 4:  # the spread of the per-round ratios: first and third quartiles
                results["throughput_ratio_to_raw_quartiles"] = {
                    m: [round(q, 3) for q in statistics.quantiles([a / b for a, b in zip(tput[m], tput["raw"])],
                                                                  n=4)[::2]]
                    for m in methods if m != "raw"}
            # geodml send() against raw pyzmq with the same guarantee (buffers free on return).
            results["send_ratio_to_raw_same_guarantee"] = {
                m: statistics.median(a / b for a, b in zip(tput["geodml"], tput[m])) for m in ("raw-tracked", "raw-copy")}
            results["send_ratio_to_raw_same_guarantee_noauth"] = {
                m: statistics.median(a / b for a, b in zip(tput["geodml-noauth"], tput[m]))
                for m in ("raw-tracked", "raw-copy")}
            results["auth_throughput_cost"] = {  # auth on / auth off, per round
                m: statistics.median(a / b for a, b in zip(tput[m], tput[m + "-noauth"]))
                for m in ("geodml", "geodml-nowait")}

        # Small-message round trip.
        m = opts["round_trips"]
        ping = np.zeros(1, dtype=np.int64)
        rtt = {"geodml": [], "geodml-noauth": [], "raw": []}
        for method in ("geodml", "geodml-noauth", "raw"):
            sync()
            for i in range(m):
                if rank == 0:
                    t0 = time.perf_counter()
                    if method != "raw":
                        comms[method].send(1, "control", [ping], step=step + i)
                        comms[method].recv(1, "control", step=step + i)
                    else:
                        raw_push.send(ping, copy=True)
                        _recv_or_fail(raw_pull)
                    rtt[method].append(time.perf_counter() - t0)
                elif method != "raw":
                    got = comms[method].recv(0, "control", step=step + i)
                    comms[method].send(0, "control", [got[0]], step=step + i)
                else:
                    got = _recv_or_fail(raw_pull)
                    raw_push.send(got[0])
        results["round_trip_s"] = {k: {"median": statistics.median(v), "p99": _quantile(v, 0.99)}
                                   for k, v in rtt.items() if v}

        # --wan real pacing.
        paced = PeerTransport(rank=rank, world_size=2, store=store, bind_host="127.0.0.1", timeout_s=60, secret=secret,
                              region_of_rank=regions, paced=True)
        latency_ms = opts["latency_ms"]
        buf = np.random.default_rng(1).integers(0, 255, size=1_000_000, dtype=np.uint8)
        pacing = []
        for ri, rate in enumerate(opts["rates_mbps"]):
            real = DistComm(rank=rank, world_size=2, region_of_rank=regions, topology=topo(rate, latency_ms),
                            wan="real", transport=paced)
            link = real.link(0, 1)
            total_bytes = link.bytes_per_s * opts["pacing_seconds"]
            size = int(min(1_000_000, max(1000, total_bytes / 25)))
            count = max(10, math.ceil(total_bytes / size))
            base = ri * 10_000_000
            sync()
            if rank == 0:
                for i in range(count):
                    real.send(1, "update", [buf[:size]], step=base + i)
                real.recv(1, "control", step=base)
            else:
                arrivals, wire = [], []
                for i in range(count):
                    got = real.recv(0, "update", step=base + i)
                    arrivals.append(time.monotonic())
                    wire.append(got[0].nbytes + envelope_nbytes("update", base + i, 0, [got[0]]))
                achieved = sum(wire[1:]) / (arrivals[-1] - arrivals[0])
                real.send(0, "control", [ack], step=base)
            sync()
            # Latency probes, spaced so that each finds the link idle.
            gap_s = 0.002 + 2 * (link.transfer_s(64) - link.latency_s)
            errors = []
            for j in range(opts["probes"]):
                if rank == 0:
                    real.send(1, "travel", [np.array([time.monotonic()])], step=base + j)
                    time.sleep(gap_s)
                else:
                    got = real.recv(0, "travel", step=base + j)
                    now = time.monotonic()
                    nbytes = got[0].nbytes + envelope_nbytes("travel", base + j, 0, [got[0]])
                    errors.append(now - float(got[0][0]) - link.transfer_s(nbytes))
            if rank == 1:
                store.set(f"bench/pacing/{ri}", json.dumps({
                    "rate_mbps": rate, "latency_ms": latency_ms, "message_bytes": size, "messages": count,
                    "achieved_mbps": achieved * 8 / 1e6,
                    "latency_error_median_ms": statistics.median(errors) * 1e3,
                    "latency_error_p99_ms": _quantile(errors, 0.99) * 1e3}))
            sync()
            if rank == 0:
                pacing.append(json.loads(store.get(f"bench/pacing/{ri}")))
        results["pacing"] = pacing
        # Baseline: one-way delivery of an isolated raw message (the receiving process is idle
        # between messages, as in the probes above), which every latency error includes.
        sync()
        one_way = []
        for _ in range(opts["probes"]):
            if rank == 0:
                raw_push.send(np.array([time.monotonic()]), copy=True)
                time.sleep(0.002)
            else:
                got = _recv_or_fail(raw_pull)
                one_way.append(time.monotonic() - float(np.frombuffer(got[0], dtype=np.float64)[0]))
        if rank == 1:
            store.set("bench/one_way", json.dumps({"median_ms": statistics.median(one_way) * 1e3,
                                                   "p99_ms": _quantile(one_way, 0.99) * 1e3}))
        sync()
        if rank == 0:
            results["raw_isolated_one_way_ms"] = json.loads(store.get("bench/one_way"))
    finally:
        plain.close()
        noauth.close()
        if paced is not None:
            paced.close()
        raw_push.close(linger=1000)
        raw_pull.close(linger=0)
        zctx.term()
    return results


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(math.ceil(q * len(s))) - 1)]


def format_table(r: dict) -> str:
    tp, ratio = r["throughput_bytes_per_s"], r["throughput_ratio_to_raw"]
    lines = [
        f"geodml transport benchmark: 2 processes, loopback TCP; {r['rounds']} interleaved rounds of "
        f"{r['messages']} messages, medians (ratio: median of the per-round ratios)",
        "",
        f"{'measurement':50s} {'geodml':>12s} {'raw pyzmq':>12s} {'ratio':>7s}  target",
    ]
    for m, label in (("geodml", "1 MB sparse update, send() (buffers free on return)"),
                     ("geodml-nowait", "1 MB sparse update, send(wait=False) + flush()"),
                     ("geodml-noauth", "  the same, --wire-auth off: send()"),
                     ("geodml-nowait-noauth", "  the same, --wire-auth off: send(wait=False)")):
        ok = "ok" if ratio[m] >= 0.8 else "MISSED"
        q = r.get("throughput_ratio_to_raw_quartiles", {}).get(m)
        spread = f"  (rounds' quartiles {q[0]:.2f}-{q[1]:.2f})" if q else ""
        lines.append(f"{label:50s} {tp[m] / 1e9:>7.2f} GB/s {tp['raw'] / 1e9:>7.2f} GB/s {ratio[m]:>6.2f}x  "
                     f">= 0.80x {ok}{spread}")
    same = r.get("send_ratio_to_raw_same_guarantee")
    if same:
        lines.append("  raw pyzmq with send()'s guarantee (its ratio: to the plain raw send; last: geodml send() / it)")
        for m, label in (("raw-tracked", "  copy=False, track=True, wait each message"),
                         ("raw-copy", "  copy=True (ZeroMQ copies the buffers)")):
            same_off = r.get("send_ratio_to_raw_same_guarantee_noauth", {})
            lines.append(f"{label:50s} {'':>12s} {tp[m] / 1e9:>7.2f} GB/s {ratio[m]:>6.2f}x  "
                         f"send() {same[m]:.2f}x of it" + (f" ({same_off[m]:.2f}x auth off)" if m in same_off else ""))
    cost = r.get("auth_throughput_cost")
    if cost:
        lines.append(f"  authentication keeps {cost['geodml']:.2f}x (send()) / {cost['geodml-nowait']:.2f}x "
                     f"(wait=False) of the --wire-auth off throughput")
    rt = r["round_trip_s"]
    for m in ("geodml", "geodml-noauth"):
        for stat in ("median", "p99"):
            a, b = rt[m][stat] * 1e6, rt["raw"][stat] * 1e6
            what = "8 B round trip, " + stat + (", --wire-auth off" if m.endswith("noauth") else "")
            lines.append(f"{what:50s} {a:>10.0f} us {b:>9.0f} us {a / b:>6.2f}x")
    lines += ["", f"--wan real pacing (one-way latency {r['pacing'][0]['latency_ms']:g} ms)" if r["pacing"] else "",
              f"{'configured':>12s} {'achieved':>14s} {'ratio':>8s} {'messages':>14s}  {'latency error median / p99':>28s}"]
    for p in r["pacing"]:
        ach = p["achieved_mbps"] / p["rate_mbps"]
        ok_rate = abs(ach - 1) <= 0.02
        ok_lat = abs(p["latency_error_median_ms"]) <= 0.5
        lines.append(
            f"{p['rate_mbps']:>7g} Mbit/s {p['achieved_mbps']:>8.3f} Mbit/s {ach:>7.2%} "
            f"{p['messages']:>4d} x {p['message_bytes']:>7d} B  {p['latency_error_median_ms']:>+9.3f} / "
            f"{p['latency_error_p99_ms']:+.3f} ms  rate {'ok' if ok_rate else 'MISSED'}, latency "
            f"{'ok' if ok_lat else 'MISSED'}")
    ow = r.get("raw_isolated_one_way_ms")
    if ow:
        lines.append(f"(latency errors include loopback delivery of an isolated message: raw pyzmq one-way "
                     f"{ow['median_ms']:.3f} / {ow['p99_ms']:.3f} ms median / p99)")
    lines.append("targets: achieved within 2% of configured; median latency error within 0.5 ms")
    return "\n".join(lines)
