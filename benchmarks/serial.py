"""Benchmark (t): the serial stage's CPU per steady micro-batch, and its subscription changes' part.

Runs the local pipeline in one process on a workload written by ``skpub
workload geonames`` (its ``stream.jsonl``, ``deployment.json`` and
``vocabulary.json``): the first batch loads the subscriptions, then each
steady batch (the second and the third) is parsed ahead and stepped, and the
thread CPU seconds of ``Sequencer._sequence_others`` (the subscribes,
unsubscribes and snapshots: :mod:`skpub.router.sequencer`), of the whole
``Sequencer.sequence`` and of the batch report's ``sequencer`` stage are
printed per run, averaged over the steady batches. Compare two trees by
running it with ``PYTHONPATH`` set to each, alternating, from a directory
holding neither (``python -m`` puts the working directory first).

Run::

    .venv/bin/python -m benchmarks.serial WORKLOAD_DIR [--runs 2] [--batch-size 100000]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import tempfile
import time
from pathlib import Path

from skpub.app.engines.local import LocalPipeline
from skpub.app.engines.sink import write_batch
from skpub.kernel.config import load_deployment
from skpub.kernel.inputs import batches, iter_lines
from skpub.kernel.runtime import tune_gc
from skpub.kernel.text import load_vocabulary, pin_vocabulary
from skpub.router.sequencer import Sequencer

STEADY = (1, 2)
"""The batches measured: after the first, which loads the subscriptions."""


def _timed(seconds: dict[str, float], name: str, method):  # noqa: ANN001, ANN202
    """Wrap ``method`` so that its thread CPU seconds add up in ``seconds[name]``."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        start = time.thread_time()
        try:
            return method(*args, **kwargs)
        finally:
            seconds[name] = seconds.get(name, 0.0) + time.thread_time() - start

    return wrapper


def main(argv: list[str] | None = None) -> None:
    """Print, per run, the serial stage's CPU seconds per steady batch."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", type=Path, help="a directory written by skpub workload geonames")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=100_000)
    args = parser.parse_args(argv)
    w = args.workload
    dep = load_deployment(w / "deployment.json").replace(
        batch_size=args.batch_size, vocabulary=str(w / "vocabulary.json")
    )
    dep = pin_vocabulary(dep)
    vocabulary = load_vocabulary(dep.vocabulary, dep.vocabulary_digest)
    lines = list(itertools.islice(batches(iter_lines(str(w / "stream.jsonl")), args.batch_size), 3))
    if len(lines) <= max(STEADY):
        raise SystemExit(f"the workload has {len(lines)} batches of {args.batch_size} lines: it needs 3")
    seconds: dict[str, float] = {}
    for name in ("_sequence_others", "sequence"):
        setattr(Sequencer, name, _timed(seconds, name, getattr(Sequencer, name)))
    tune_gc()
    print("| run | subscription changes s | sequence s | sequencer stage s |\n|---:|---:|---:|---:|")
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as out:
            pipeline = LocalPipeline.new(Path(out), dep, vocabulary, lines[0][: dep.sample_size])
            sink = functools.partial(write_batch, Path(out))
            pipeline.step(0, lines[0], sink)
            located = {b: pipeline.router.locate(lines[b], b, pipeline.epoch_for(b)) for b in STEADY}
            seconds.clear()
            stage = sum(pipeline.step(b, lines[b], sink, located[b]).stage_cpu["sequencer"] for b in STEADY)
        n = len(STEADY)
        print(
            f"| {run + 1} | {seconds['_sequence_others'] / n:.3f} | {seconds['sequence'] / n:.3f} | {stage / n:.3f} |"
        )


if __name__ == "__main__":
    main()
