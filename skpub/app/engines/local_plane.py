"""The daemon's local data plane: the embedded engine's pipeline over the daemon's logs.

:class:`LocalPlane` is to ``skpub serve --engine local`` what
:class:`~skpub.app.engines.spark.SparkPlane` is to ``--engine spark``: the
daemon (:class:`skpub.app.daemon.Daemon`) journals micro-batches of its
ingest log and drives the plane; the plane runs each batch through a
:class:`~skpub.app.engines.local.LocalPipeline`, hands its outputs to
:meth:`Daemon.commit <skpub.app.daemon.Daemon.commit>` (exactly once, in
the commit log's order) and checkpoints the pipeline
(:mod:`~skpub.app.engines.local_checkpoint`) every
``Limits.checkpoint_seconds``, so a restart restores the newest checkpoint
of a committed batch and replays the journaled batches after it.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

import orjson

from skpub.app.engines import local_checkpoint
from skpub.app.engines.local import LocalPipeline
from skpub.app.engines.sink import unique_letters
from skpub.app.summary import BatchReport
from skpub.kernel.errors import CheckpointError
from skpub.kernel.parts import delivery_lines
from skpub.kernel.runtime import FULL_COLLECTION_SECONDS, FullCollections, tune_gc

if TYPE_CHECKING:
    from skpub.app.daemon import Daemon
    from skpub.evaluators.merge import RankedMerge

CHECKPOINTS = "checkpoints"
"""The data directory's folder of local-engine checkpoints (:mod:`skpub.app.engines.local_checkpoint`)."""


class LocalPlane:
    """The local engine's data plane of a daemon: its pipeline, checkpoints and collector."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.pipeline: LocalPipeline | None = None
        self.collect = FullCollections(FULL_COLLECTION_SECONDS)
        self.checkpointed_at = time.monotonic()

    @property
    def merge(self) -> RankedMerge | None:
        """The ranked merge as of the last batch run (None before the first)."""
        return self.pipeline.merge if self.pipeline is not None else None

    def restore(self) -> int:
        """Load the newest readable checkpoint of a committed batch; return the first batch to replay after it.

        An unreadable checkpoint is reported and the one before is tried
        (the first batch, with none). A restored pipeline is frozen for the
        collector (:func:`~skpub.kernel.runtime.tune_gc`) before any idle
        collection.
        """
        daemon = self.daemon
        saved = local_checkpoint.checkpoints(daemon.data / CHECKPOINTS)
        for batch_id in sorted((b for b in saved if b <= daemon.committed_batch), reverse=True):
            try:
                self.pipeline, _ = local_checkpoint.load(
                    saved[batch_id], daemon.data / "output", daemon.deployment, daemon.vocabulary
                )
            except CheckpointError as exc:
                print(f"[skpub] {exc}; trying an older checkpoint", file=sys.stderr, flush=True)
                continue
            tune_gc()
            return batch_id + 1
        return 0

    def step(self, batch_id: int) -> None:
        """Run journaled micro-batch ``batch_id``, commit its outputs, checkpoint when due, collect.

        :func:`~skpub.kernel.runtime.tune_gc` once the pipeline exists, as
        ``skpub run`` (the young generation rescans the live subscriptions
        and window far less often), with timed full collections
        (:class:`~skpub.kernel.runtime.FullCollections`, after the batch and
        when idle, so the batch's wall time does not hold one) for the
        cycles that reach the oldest generation.
        """
        daemon = self.daemon
        daemon.batch_started = time.monotonic()
        start = daemon.ends.start(batch_id)
        lines = daemon.ingest.read(start, daemon.ends.end(batch_id) - start)
        if self.pipeline is None:
            sample = lines[: daemon.deployment.sample_size]
            self.pipeline = LocalPipeline.new(daemon.data / "output", daemon.deployment, daemon.vocabulary, sample)
        tune_gc()
        daemon.metrics.observe_batch(self.pipeline.step(batch_id, lines, self._sink), daemon.deployment.evaluators)
        self._checkpoint(batch_id)
        self.collect()

    def idle(self) -> None:
        """Collect in full when due while no batch waits (the HTTP threads' cycles too)."""
        if self.pipeline is not None:
            self.collect()

    def _checkpoint(self, batch_id: int) -> None:
        """Checkpoint the pipeline after committed batch ``batch_id`` when it is due."""
        now = time.monotonic()
        if now - self.checkpointed_at < self.daemon.limits.checkpoint_seconds:
            return
        if batch_id == self.daemon.committed_batch:
            local_checkpoint.save(self.pipeline, self.daemon.data / CHECKPOINTS, batch_id)
            self.checkpointed_at = now

    def _sink(self, batch_id, deliveries, dead_letters, statistics, report: BatchReport, events, snapshots):  # noqa: ANN001, ARG002
        """Commit a batch's outputs with its report (:meth:`Daemon.commit`): the pipeline's sink."""
        matches = [line for part in deliveries for line in delivery_lines(part).split(b"\n")[:-1]]
        self.daemon.commit(
            report,
            {
                "deliveries": [*matches, *(orjson.dumps(e) for e in events)],
                "dead_letters": [orjson.dumps(d.to_json(with_pos=True)) for d in unique_letters(dead_letters)],
                "snapshots": [orjson.dumps(s) for s in snapshots],
            },
        )
