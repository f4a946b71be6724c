"""Benchmark: bytes of memory per live range subscription in the embedded engine (issue 43, item 6).

Registers ``--live`` GeoNames range subscriptions (the default workload's
keyword mix and sizes, no objects) through the local engine's pipeline
(``LocalPipeline``: the router's registry and textual summaries, every
evaluator's GI^2 index, state blocks and load statistics) in one process,
and reports the growth of the process's resident memory (``/proc/self/statm``,
after a full collection) divided by the subscriptions: what a live
subscription costs the engine, allocator slack included. The generated
lines are counted apart (they are read before the baseline is taken).

Run: ``.venv/bin/python -m benchmarks.footprint --live 100000 1000000``.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from pathlib import Path

from skpub.app.engines.local import LocalPipeline
from skpub.kernel.config import deployment_from_json
from skpub.kernel.text import load_vocabulary
from skpub.sims.geonames import WorkloadSpec, deployment_of, write_workload

PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    """This process's resident memory after a full collection, bytes."""
    gc.collect()
    return int(Path("/proc/self/statm").read_text().split()[1]) * PAGE


def footprint(live: int, evaluators: int, batch_size: int) -> tuple[int, float, int, int]:
    """Return (subscriptions, bytes per subscription, seconds, parts held) for ``live`` range subscriptions."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = WorkloadSpec(live=live, objects=0, topk_fraction=0.0, knn_fraction=0.0, window=0)
        stream, vocabulary_path = write_workload(spec, f"{tmp}/workload")
        lines = [line for line in Path(stream).read_bytes().splitlines() if b'"subscribe"' in line]
        deployment = deployment_from_json(deployment_of(spec)).replace(
            evaluators=evaluators, batch_size=batch_size, vocabulary=str(vocabulary_path)
        )
        vocabulary = load_vocabulary(deployment.vocabulary)
        before = resident_bytes()
        start = time.perf_counter()
        pipeline = LocalPipeline.new(Path(tmp) / "out", deployment, vocabulary, lines[:1000])
        for batch_id, first in enumerate(range(0, len(lines), batch_size)):
            pipeline.step(batch_id, lines[first : first + batch_size], lambda *parts: None)
        seconds = time.perf_counter() - start
        held = sum(ev.subscriptions for ev in pipeline.evaluators)
        grown = resident_bytes() - before
        del pipeline
        return len(lines), grown / max(1, len(lines)), int(seconds), held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--evaluators", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=100_000)
    args = parser.parse_args()
    for live in args.live:
        count, per, seconds, held = footprint(live, args.evaluators, args.batch_size)
        print(
            f"live {count:,} range subscriptions ({held:,} parts in {args.evaluators} evaluators): "
            f"{per:,.0f} bytes each ({count * per / 2**20:,.0f} MiB), registered in {seconds} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
