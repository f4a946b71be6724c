"""Benchmark: the routing daemon (``skpub serve``) under posted load (docs/benchmarks.md (g)).

Starts ``skpub serve`` on loopback with a fresh data directory, registers
the GeoNames workload's live subscriptions, then posts its objects at a
fixed rate in requests of ``--request-lines`` lines for ``--duration``
seconds (one client thread), while a consumer long-polls
``/v1/deliveries``. Reported:

- sustained ingest: records acknowledged per second, and records processed
  per second (the data plane keeping up or not: the backlog at the end);
- ingest-to-delivery latency p50 and p99, measured by the client: from a
  request's acknowledgement to the moment ``/readyz`` shows the data plane
  past its last record (polled every 5 ms);
- the daemon's resident memory (``/proc/<pid>/status`` VmRSS) every second:
  first and last minute's means and their ratio (flat within 10% is the
  target of a 10-minute soak); per minute, whole and by process
  (:func:`process_kind`: the daemon, on Spark its JVM, evaluator hosts, the
  sequencer host and Python workers), and the JVM heap's committed and used
  size (``jstat -gc`` every 30 s).

Memory is the daemon's process tree and the hosts of its JVM
(:func:`daemon_processes`: a host whose Python worker exited is still
counted).

Run: ``.venv/bin/python -m benchmarks.daemon --rate 5000 --duration 60 [--engine spark]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from skpub.kernel.config import deployment_from_json
from skpub.sims.geonames import WorkloadSpec, deployment_of, write_workload
from tests.served import WebhookReceiver, free_port


def process_kind(pid: int, root: int) -> str:
    """Which part of the daemon process ``pid`` is.

    ``daemon`` (the root), ``jvm``, ``evaluator hosts`` (Spark's
    ``skpub.evaluators.host`` processes), ``sequencer host``
    (``skpub.app.engines.sequencer_host``), ``python workers`` (PySpark's,
    the data source's included) or ``other``.
    """
    if pid == root:
        return "daemon"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError):
        return "other"
    if argv and argv[0].endswith(b"java"):
        return "jvm"
    if HOSTS["evaluator hosts"] in argv:
        return "evaluator hosts"
    if HOSTS["sequencer host"] in argv:
        return "sequencer host"
    if any(arg.startswith(b"pyspark.") for arg in argv):
        return "python workers"
    return "other"


HOSTS = {"evaluator hosts": b"skpub.evaluators.host", "sequencer host": b"skpub.app.engines.sequencer_host"}
"""Host kinds by entry module: a host runs as ``python -P -m MODULE SOCKET WATCH`` (skpub.kernel.host)."""


def daemon_processes(root: int) -> list[int]:
    """Process ``root``, its descendants, and the hosts of a JVM among them, those still alive.

    A host starts in a session of its own and outlives the Python worker
    that started it (Spark ends idle workers), so it may no longer descend
    from the daemon: it is found by the JVM pid it watches, its last argument.
    """
    tree = descendants(root)
    jvms = {str(p).encode() for p in tree if process_kind(p, root) == "jvm"}
    hosts = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in tree:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if len(argv) >= 2 and argv[-1] in jvms and any(module in argv for module in HOSTS.values()):
            hosts.append(int(entry.name))
    return tree + hosts


def descendants(pid: int) -> list[int]:
    """Process ``pid`` and all its descendants (``/proc/PID/task/*/children``), those alive when their turn came.

    A thread that ends while its ``children`` is read is skipped, not its
    process: the JVM starts and ends task threads all the time, and skipping
    the JVM on such a race dropped it, with the Python workers below it, from
    some memory samples (the per-minute means of a soak swung by 500 MiB).
    """
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        try:
            threads = list(Path(f"/proc/{p}/task").iterdir())
        except (FileNotFoundError, ProcessLookupError):
            continue
        for t in threads:
            try:
                stack += [int(c) for c in (t / "children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError):
                continue
        out.append(p)
    return out


def process_cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat`` utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_by_kind(root: int) -> dict[str, int]:
    """Resident memory (VmRSS, KiB) of :func:`daemon_processes`, summed by :func:`process_kind`."""
    out: dict[str, int] = {}
    for pid in daemon_processes(root):
        try:
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
        except (FileNotFoundError, ProcessLookupError):
            continue
        for line in status:
            if line.startswith("VmRSS:"):
                kind = process_kind(pid, root)
                out[kind] = out.get(kind, 0) + int(line.split()[1])
    return out


def jvm_heap_kib(root: int) -> tuple[int, int] | None:
    """Java heap (committed, used) in KiB of the JVM below ``root``, from ``jstat -gc``; None without a JVM or jstat.

    ``jstat`` is the one beside the JVM's own executable (a JRE has none).
    Used includes garbage not yet collected: the live heap is ``jcmd PID
    GC.class_histogram``'s, which collects first.
    """
    jvm = next((p for p in descendants(root) if process_kind(p, root) == "jvm"), None)
    if jvm is None:
        return None
    try:
        jstat = Path(os.readlink(f"/proc/{jvm}/exe")).with_name("jstat")
        out = subprocess.run([jstat, "-gc", str(jvm)], capture_output=True, text=True, timeout=10).stdout
        head, values = out.split("\n")[:2]
        row = dict(zip(head.split(), values.split(), strict=True))
        committed = sum(float(row[c]) for c in ("S0C", "S1C", "EC", "OC"))
        used = sum(float(row[c]) for c in ("S0U", "S1U", "EU", "OU"))
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired):
        return None
    return int(committed), int(used)


def per_minute(samples: list[tuple[float, float]], start: float, minutes: int) -> list[float | None]:
    """Mean of ``(monotonic seconds, value)`` samples in each of ``minutes`` minutes from ``start``; None if empty."""
    buckets: list[list[float]] = [[] for _ in range(minutes)]
    for t, v in samples:
        m = int((t - start) // 60)
        if 0 <= m < minutes:
            buckets[m].append(v)
    return [statistics.mean(b) if b else None for b in buckets]


def series(values: list[float | None]) -> str:
    """Format :func:`per_minute` output, MiB, ``-`` for a minute without samples."""
    return " ".join("-" if v is None else f"{v:.0f}" for v in values)


UNTUNED = (
    "import sys, skpub.app.engines.local_plane as plane; plane.tune_gc = lambda: None; "
    "from skpub.app.cli import main; sys.exit(main(sys.argv[1:]))"
)
"""``skpub serve`` with the daemon's collector tuning off: what the local daemon did before 2026-11-27."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=5000.0, help="objects posted per second")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of posting")
    parser.add_argument("--request-lines", type=int, default=1000)
    parser.add_argument("--live", type=int, default=10_000, help="live subscriptions registered first")
    parser.add_argument("--evaluators", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=20_000)
    parser.add_argument("--horizon", type=int, default=None, help="object_id_horizon (default the deployment's)")
    parser.add_argument("--engine", choices=("local", "spark"), default="local")
    parser.add_argument("--segment-bytes", type=int, default=None, help="the daemon's --segment-bytes")
    parser.add_argument(
        "--untuned-gc", action="store_true", help="run the daemon with CPython's collector defaults (no tune_gc)"
    )
    parser.add_argument(
        "--target", choices=("none", "webhook"), default="none", help="push deliveries to a webhook receiver here"
    )
    parser.add_argument(
        "--fail-seconds",
        type=float,
        default=0.0,
        help="the webhook answers 500 for this long from the first post; with --target none: the same windows'"
        " rates, to compare with",
    )
    args = parser.parse_args()
    if args.untuned_gc and args.engine == "spark":
        parser.error("--untuned-gc is the local daemon's: Spark's driver and tasks tune their own collectors")

    with tempfile.TemporaryDirectory() as tmp:
        spec = WorkloadSpec(live=args.live, topk_fraction=0.0, knn_fraction=0.0, window=0, inserts_per_object=0.0)
        stream, vocabulary = write_workload(spec, f"{tmp}/workload")
        lines = Path(stream).read_text().splitlines()
        subscriptions = [line for line in lines if '"subscribe"' in line]
        objects = [line for line in lines if '"object"' in line]
        dep = deployment_from_json(deployment_of(spec)).replace(
            evaluators=args.evaluators, batch_size=args.batch_size, vocabulary=str(vocabulary)
        )
        if args.horizon is not None:
            dep = dep.replace(object_id_horizon=args.horizon)
        Path(f"{tmp}/dep.json").write_text(json.dumps(dep.to_json()))
        port = free_port()
        daemon = ["-c", UNTUNED] if args.untuned_gc else ["-m", "skpub.app.cli"]
        cmd = [sys.executable, *daemon, "serve", "--data", f"{tmp}/data", "--config", f"{tmp}/dep.json",
               "--listen", f"127.0.0.1:{port}", "--engine", args.engine]  # fmt: skip
        if args.segment_bytes is not None:
            cmd += ["--segment-bytes", str(args.segment_bytes)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        while True:
            try:
                http.get("/healthz")
                break
            except httpx.TransportError:
                time.sleep(0.1)
        acked_at: dict[str, float] = {}  # object id -> when its request was acknowledged
        arrivals: list[float] = []  # ack-to-arrival seconds of each delivery line the webhook took
        receiver = None
        if args.target == "webhook":
            receiver = WebhookReceiver(on_body=lambda body: arrivals.extend(
                time.monotonic() - acked_at[d["obj"]] for d in body["deliveries"] if d["obj"] in acked_at))  # fmt: skip
            if args.fail_seconds > 0:
                receiver.failing.set()
            reply = http.put("/v1/targets/bench", json={"kind": "webhook", "url": receiver.url, "batch": 1000})
            assert reply.status_code == 201, reply.text
        for start in range(0, len(subscriptions), args.request_lines):
            http.post("/v1/records", content="\n".join(subscriptions[start : start + args.request_lines]) + "\n")
        while http.get("/readyz").status_code != 200:
            time.sleep(0.05)
        print(
            f"(g) daemon, {args.engine} engine: {len(subscriptions)} subscriptions registered; posting "
            f"{args.rate:.0f} objects/s in requests of {args.request_lines} for {args.duration:.0f} s"
        )

        acks: list[tuple[int, float]] = []  # (end position, acknowledged at)
        done: dict[int, float] = {}
        memory: list[tuple[float, dict[str, int]]] = []  # (at, KiB by process kind)
        heap: list[tuple[float, tuple[int, int]]] = []  # (at, the JVM heap's committed and used KiB)
        stop = threading.Event()
        delivered = [0]
        progress: list[tuple[float, int]] = []  # (at, ingest lines processed)

        def watch() -> None:  # the data plane's progress, and memory
            client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
            last_memory = 0.0
            while not stop.is_set():
                processed = client.get("/readyz").json()["processed"]
                now = time.monotonic()
                progress.append((now, processed))
                if receiver is not None and receiver.failing.is_set() and now - begin >= args.fail_seconds:
                    receiver.failing.clear()
                for end, _ in acks:
                    if end <= processed and end not in done:
                        done[end] = now
                if now - last_memory >= 1.0:
                    memory.append((now, rss_by_kind(proc.pid)))
                    last_memory = now
                time.sleep(0.005)

        def consume() -> None:
            client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
            after = 0
            while not stop.is_set():
                page = client.get("/v1/deliveries", params={"after": after, "limit": 10_000, "wait": 1}).json()
                delivered[0] += len(page["deliveries"])
                after = page["next"]

        def watch_heap() -> None:  # jstat starts a JVM of its own: every 30 s
            while not stop.wait(30.0):
                sample = jvm_heap_kib(proc.pid)
                if sample is not None:
                    heap.append((time.monotonic(), sample))

        begin = time.monotonic()
        threads = [threading.Thread(target=f) for f in (watch, consume, watch_heap)]
        for t in threads:
            t.start()
        cpu_begin = process_cpu_seconds(proc.pid)
        sent, i = 0, 0
        while time.monotonic() - begin < args.duration:
            due = begin + sent / args.rate
            if time.monotonic() < due:
                time.sleep(due - time.monotonic())
            chunk = [objects[(i + k) % len(objects)] for k in range(args.request_lines)]
            chunk = [line.replace('"id": "', f'"id": "r{(i + k) // len(objects)}-', 1) for k, line in enumerate(chunk)]
            i += args.request_lines
            reply = http.post("/v1/records", content="\n".join(chunk) + "\n")
            if reply.status_code == 202:
                acked = time.monotonic()
                acks.append((reply.json()["last"] + 1, acked))
                sent += args.request_lines
                if receiver is not None:
                    for line in chunk:
                        acked_at[line.split('"id": "', 1)[1].split('"', 1)[0]] = acked
            else:
                time.sleep(float(reply.headers.get("retry-after", "1")))
        posting = time.monotonic() - begin
        drain_start = time.monotonic()
        while http.get("/readyz").status_code != 200 and time.monotonic() - drain_start < 300:
            time.sleep(0.05)
        processed_by = time.monotonic() - begin
        time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join()
        latencies = sorted(done[end] - at for end, at in acks if end in done)
        cpu = process_cpu_seconds(proc.pid) - cpu_begin
        proc.terminate()
        proc.wait(60)
        p50 = statistics.median(latencies)
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        print(f"  acknowledged {sent} objects in {posting:.1f} s: {sent / posting:.0f} objects/s posted")
        print(f"  processed by {processed_by:.1f} s: {sent / processed_by:.0f} objects/s sustained; "
              f"{delivered[0]} deliveries read by the consumer")  # fmt: skip
        print(f"  CPU of the daemon's own process (on Spark: the driver's Python) while posting and draining:"
              f" {cpu:.1f} s, {cpu / max(sent, 1) * 1e6:.0f} us per object")  # fmt: skip
        print(
            f"  ingest-to-delivery latency: p50 {p50 * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms ({len(latencies)} requests)"
        )
        if receiver is not None:
            print_target(receiver, arrivals)
        if args.fail_seconds > 0:
            print_windows(progress, begin, args.fail_seconds, posting, receiver is not None)
        total = [(t, sum(kib.values()) / 1024) for t, kib in memory]
        start, minutes = total[0][0], int((total[-1][0] - total[0][0]) // 60) + 1
        print("  resident memory per minute, MiB: " + series(per_minute(total, start, minutes)))
        for kind in sorted({kind for _, kib in memory for kind in kib}):
            by_kind = [(t, kib.get(kind, 0) / 1024) for t, kib in memory]
            print(f"    {kind}: " + series(per_minute(by_kind, start, minutes)))
        if heap:
            committed = per_minute([(t, c / 1024) for t, (c, _) in heap], start, minutes)
            used = per_minute([(t, u / 1024) for t, (_, u) in heap], start, minutes)
            print("    jvm heap committed: " + series(committed))
            print("    jvm heap used (garbage included): " + series(used))
        elif args.engine == "spark":
            print("    jvm heap: unavailable (no jstat beside the JVM, or it could not attach)")
        first = statistics.mean(v for t, v in total if t - total[0][0] <= 60)
        final = statistics.mean(v for t, v in total if total[-1][0] - t <= 60)
        print(f"  resident memory: first minute {first:.0f} MiB, last minute {final:.0f} MiB ({final / first:.2f}x)")
        kept = disk_by_log(Path(tmp) / "data")
        print(f"  data directory at the end, MiB: {sum(kept.values()) / 2**20:.1f} ("
              + ", ".join(f"{name} {size / 2**20:.1f}" for name, size in sorted(kept.items())) + ")")  # fmt: skip


def print_target(receiver, arrivals) -> None:  # noqa: ANN001
    """Print the webhook's deliveries and their latency."""
    took = sorted(arrivals)
    unique = {d["offset"] for body in receiver.bodies for d in body["deliveries"]}
    if took:
        p50, p99 = statistics.median(took), took[min(len(took) - 1, int(0.99 * len(took)))]
        print(f"  webhook: {len(unique)} delivery lines ({len(took)} with their arrivals timed); acknowledged POST"
              f" to arrival at the webhook: p50 {p50 * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms")  # fmt: skip
    receiver.close()


def print_windows(progress, begin: float, fail_seconds: float, posting: float, webhook: bool) -> None:  # noqa: ANN001
    """Print the data plane's rate from 5 s to ``fail_seconds`` (the webhook failing, if there is one) and after."""

    def rate(start: float, end: float) -> float:
        inside = [(t, n) for t, n in progress if begin + start <= t <= begin + end]
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]) if len(inside) > 1 else 0.0

    failing, after = rate(5, fail_seconds), rate(fail_seconds + 5, posting)
    what = "while the webhook failed" if webhook else "with no target"
    then = "after it answered again" if webhook else "after"
    print(f"  data plane {what} (5 s to {fail_seconds:.0f} s): {failing:,.0f} lines/s processed;"
          f" {then}: {after:,.0f} lines/s ({failing / max(after, 1e-9):.2f}x)")  # fmt: skip


def disk_by_log(data: Path) -> dict[str, int]:
    """Return the bytes of the data directory by log (segment files grouped by name) or folder."""
    out: dict[str, int] = {}
    for path in data.rglob("*"):
        if path.is_file():
            top = path.relative_to(data).parts[0]
            name = top.split("-")[0].split(".")[0] if path.parent == data else top
            out[name] = out.get(name, 0) + path.stat().st_size
    return out


if __name__ == "__main__":
    main()
