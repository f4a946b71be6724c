"""Benchmark: how long a restarted ``skpub serve`` takes to be ready, idle and on a busy machine.

Starts the daemon on a fresh data directory, posts a random workload of
``--lines`` records, waits until ``--kill-after`` seconds into its backlog
and kills it with SIGKILL, then starts it again on the same directory and
polls ``/readyz`` every 50 ms from the moment the process is started:
reported are the seconds until the HTTP API answers, until each starting
thing it starts (``starting``: Spark, opening its checkpoint, the
streaming query) and the ``running`` phase first show, and until it is
ready (every acknowledged record processed), with how many batches the
restart ran again. ``--load N`` keeps N busy processes spinning on the CPU
during the restart (a busy machine: load N plus the daemon's own).

Run: ``.venv/bin/python -m benchmarks.restart --engine spark --load 0 6 --rounds 2``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import signal
import tempfile
import time
from pathlib import Path

from tests.served import Served
from tests.workloads import deployment, random_workload


def spin() -> None:  # pragma: no cover - a busy process
    while True:
        pass


def timeline(served: Served, started: float, limit: float) -> dict:
    """Poll ``/readyz`` until ready (or ``limit`` seconds); return when each phase and what it started first showed."""
    marks: dict[str, float] = {"http": time.monotonic() - started}
    body: dict = {}
    while time.monotonic() - started < limit:
        reply = served.http.get("/readyz")
        body = reply.json()
        key = body["phase"] if body.get("starting") is None else f"{body['phase']}: {body['starting']}"
        marks.setdefault(key, time.monotonic() - started)
        if reply.status_code == 200:
            marks["ready"] = time.monotonic() - started
            break
        time.sleep(0.05)
    return {"marks": marks, "last": body}


def restart_round(engine: str, lines: int, kill_after: float, load: int, limit: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        records = random_workload(seed=31, n=lines, invalid=False)
        dep = deployment(evaluators=4, batch_size=120 if engine == "spark" else 20)
        (tmp / "dep.json").write_text(json.dumps(dep.to_json()))
        extra = ("--checkpoint-seconds", "0")
        served = Served(tmp / "data", tmp / "dep.json", engine=engine, extra=extra)
        for start in range(0, len(records), 100):
            served.post(records[start : start + 100])
        time.sleep(kill_after)
        before = served.http.get("/readyz").json()
        served.proc.send_signal(signal.SIGKILL)
        served.proc.wait()
        served.http.close()
        spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(load)]
        for p in spinners:
            p.start()
        try:
            started = time.monotonic()
            restarted = Served(tmp / "data", tmp / "dep.json", engine=engine, extra=extra, start_seconds=limit)
            result = timeline(restarted, started, limit)
            restarted.proc.terminate()
            restarted.proc.wait(120)
        finally:
            for p in spinners:
                p.kill()
        result["killed_at"] = {k: before.get(k) for k in ("processed", "acknowledged", "committed_batch")}
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="spark", choices=["local", "spark"])
    parser.add_argument("--lines", type=int, default=1500)
    parser.add_argument("--kill-after", type=float, default=3.0, help="seconds after the last post")
    parser.add_argument("--load", type=int, nargs="+", default=[0, 6], help="busy processes during the restart")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--limit", type=float, default=900.0, help="give up on a restart after this many seconds")
    args = parser.parse_args()
    for load in args.load:
        for r in range(args.rounds):
            result = restart_round(args.engine, args.lines, args.kill_after, load, args.limit)
            marks = " · ".join(f"{k} {v:.1f} s" for k, v in result["marks"].items())
            print(f"{args.engine} load {load} round {r + 1}: killed at {result['killed_at']}; {marks}", flush=True)
            if "ready" not in result["marks"]:
                print(f"  not ready after {args.limit} s: {result['last']}", flush=True)


if __name__ == "__main__":
    main()
