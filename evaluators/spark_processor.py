"""The Spark stateful processor that hosts one evaluator per grouping key.

Used as ``groupBy("evaluator").transformWithStateInPandas(EvaluatorProcessor(...))``
on the RocksDB state store (DESIGN "The Spark engine"). State per evaluator:

- ``blocks``: a MapState ``block (bigint) -> data (binary)`` with the
  evaluator's state blocks (:mod:`skpub.evaluators.evaluator`); a micro-batch
  rewrites only the blocks it changed;
- ``window``: a MapState ``segment -> data`` with the window objects it
  owns, one segment per micro-batch of arrival
  (:meth:`skpub.evaluators.window.WindowStore.take_segments`), and
  ``ranked``: ``batch -> changes`` of the topk/knn subscriptions it holds
  and their last reports, compacted beyond :data:`RANKED_COMPACT_EVERY`
  entries; ``clock``: the stream clock (objects accepted, watermark) and
  the merge generation the evaluator last reported to. A restored
  evaluator rebuilds its buffers from the last reports
  (:meth:`~skpub.evaluators.monitor.RankedMonitor.restore`) and reports
  everything anew only to another generation of the merge;
- ``version``: a ValueState with the last micro-batch applied.

The hot :class:`~skpub.evaluators.evaluator.Evaluator` (with its GI^2 index) is
cached in this importable module, keyed by (run id, evaluator), and
used only when its version equals the state store's; otherwise (another
worker served the key last time, or the batch is a replay after a failure
rolled the state back) it is rebuilt from the blocks. ``init()`` only
declares state: it also runs on the driver.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pandas as pd
from pyspark import TaskContext
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from skpub.evaluators.evaluator import Evaluator
from skpub.evaluators.merge import encode_updates
from skpub.evaluators.monitor import RankedMonitor
from skpub.kernel.config import deployment_from_text
from skpub.kernel.parts import delivery_lines, write_lines, write_part
from skpub.kernel.records import DeadLetter
from skpub.kernel.runtime import tune_gc
from skpub.kernel.text import load_vocabulary
from skpub.kernel.wire import from_columns

CONTROL_DDL = "evaluator int, pos bigint, line string, reason string, message string, payload string, updates binary"
"""What an evaluator sends the driver: its internal-error dead letters, and one row whose ``payload`` is
the JSON of its batch counters (deliveries, cost, CPU seconds) and whose ``updates`` are its ranked
reports for the merge (:func:`encode_updates`). Range deliveries and statistics never travel: the
evaluator writes them itself."""
_CACHE: dict[tuple[str, int], tuple[int, Evaluator]] = {}
RANKED_COMPACT_EVERY = 16
"""When an evaluator holds more than this many saved ranked-subscription changes, one document of all replaces them."""


def current_batch_id() -> int:
    """Return the micro-batch id of the running Spark task."""
    return int(TaskContext.get().getLocalProperty("streaming.sql.batchId"))


def control_frame(evaluator: int, dead: list[DeadLetter], counters: dict, updates: bytes) -> pd.DataFrame:
    """Return one evaluator's control rows (:data:`CONTROL_DDL`) for the driver."""
    n = len(dead)
    return pd.DataFrame(
        {
            "evaluator": [evaluator] * (n + 1),
            "pos": [d.pos for d in dead] + [None],
            "line": [d.line for d in dead] + [None],
            "reason": [d.reason for d in dead] + [None],
            "message": [d.message for d in dead] + [None],
            "payload": [None] * n + [json.dumps(counters)],
            "updates": [None] * n + [updates],
        }
    ).astype({"evaluator": "int32", "pos": "Int64"})


def _save(state, changes: dict) -> None:  # noqa: ANN001
    """Write changed entries of a MapState; None removes the key."""
    for key, data in changes.items():
        if data is None:
            state.removeKey((key,))
        else:
            state.updateValue((key,), (data,))


class EvaluatorProcessor(StatefulProcessor):
    """Runs :class:`~skpub.evaluators.evaluator.Evaluator` for each grouping key.

    Parameters
    ----------
    run_id : str
        Identifies the run (its checkpoint, made anew by each fresh start) in
        the executor-side cache.
    output_root : str
        The output directory: the evaluator writes its deliveries
        (``deliveries/part-<batch>-e<n>.jsonl``) and statistics there, idempotent per batch id.
    deployment_json : str
        The deployment, as JSON (picklable and cheap to ship).
    evaluator_keys : list of int
        ``evaluator_keys[e]`` is the grouping-key value of evaluator ``e``.
    generation : str
        Identifies the driver's merge (new at every query start): an
        evaluator that last reported to another merge reports every ranked
        subscription again.
    """

    def __init__(
        self, run_id: str, output_root: str, deployment_json: str, evaluator_keys: list[int], generation: str
    ) -> None:
        self.run_id = run_id
        self.output_root = output_root
        self.deployment_json = deployment_json
        self.index_of_key = {k: e for e, k in enumerate(evaluator_keys)}
        self.generation = generation

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the state variables (runs on executors and on the driver)."""
        self.blocks = handle.getMapState("blocks", "block bigint", "data binary")
        self.window = handle.getMapState("window", "segment bigint", "data binary")
        self.ranked = handle.getMapState("ranked", "batch bigint", "data binary")
        self.clock = handle.getValueState("clock", "accepted bigint, watermark double, generation string")
        self.version = handle.getValueState("version", "batch bigint")

    def _evaluator(self, e: int) -> Evaluator:
        """Return evaluator ``e`` as of the state store's version.

        The cache entry is taken out while the batch is applied (it mutates
        the evaluator) and put back only after success, so a failed attempt
        never leaves a half-applied evaluator behind for its retry.
        """
        version = self.version.get()[0] if self.version.exists() else -1
        cached = _CACHE.pop((self.run_id, e), None)
        if cached is not None and cached[0] == version:
            evaluator = cached[1]
        else:
            deployment = deployment_from_text(self.deployment_json)
            vocabulary = load_vocabulary(deployment.vocabulary)
            evaluator = Evaluator.restore(e, deployment, vocabulary, self._map(self.blocks) if version >= 0 else {})
            if version >= 0:
                accepted, watermark, generation = self.clock.get()
                evaluator.monitor = RankedMonitor.restore(
                    e,
                    deployment,
                    vocabulary,
                    (int(accepted), float(watermark)),
                    self._map(self.window),
                    [data for _, data in sorted(self._map(self.ranked).items())],
                )
                evaluator.monitor.generation = generation
        if evaluator.monitor.generation != self.generation:
            evaluator.monitor.forget_reports()
            evaluator.monitor.generation = self.generation
        return evaluator

    @staticmethod
    def _map(state) -> dict[int, bytes]:  # noqa: ANN001
        return {int(k[0]): bytes(v[0]) for k, v in state.iterator()}

    def handleInputRows(self, key, rows: Iterator[pd.DataFrame], timerValues) -> Iterator[pd.DataFrame]:  # noqa: ANN001, N802, N803
        """Apply one micro-batch's rows for evaluator ``key`` and emit its outputs."""
        tune_gc()
        batch_id = current_batch_id()
        e = self.index_of_key[int(key[0])]
        start = time.thread_time()
        evaluator = self._evaluator(e)
        restore = time.thread_time() - start
        frame = pd.concat(list(rows), ignore_index=True)
        columns = {name: frame[name].tolist() for name in frame.columns}
        result = evaluator.apply_many(from_columns(columns, e), batch_id)
        start = time.thread_time()
        _save(self.blocks, evaluator.take_dirty_blocks())
        window, ranked = evaluator.monitor.take_changes()
        _save(self.window, window)
        if ranked is not None:
            self.ranked.updateValue((batch_id,), (ranked,))
            saved = [int(k[0]) for k in self.ranked.keys()]
            if len(saved) > RANKED_COMPACT_EVERY:
                for old in saved:
                    self.ranked.removeKey((old,))
                self.ranked.updateValue((batch_id,), (evaluator.monitor.subscriptions_json(),))
        store = evaluator.monitor.store
        self.clock.update((store.accepted, store.watermark, evaluator.monitor.generation))
        self.version.update((batch_id,))
        _CACHE[(self.run_id, e)] = (batch_id, evaluator)
        state = time.thread_time() - start
        start = time.thread_time()
        stats = result.stats.to_json(e, batch_id, result.cpu_seconds, evaluator.subscriptions)
        writer = f"e{e:03d}"
        write_lines(self.output_root, "deliveries", batch_id, delivery_lines(result.deliveries), writer)
        write_part(self.output_root, "statistics", batch_id, [stats], writer)
        counters = {
            "evaluator": e,
            "deliveries": len(result.deliveries),
            "cost": stats["cost"],
            "cpu_seconds": result.cpu_seconds,
            "sink_cpu_seconds": time.thread_time() - start,
            "restore_cpu_seconds": restore,
            "state_cpu_seconds": state,
            "ranked": {key: stats[key] for key in ("reevaluations", "reevaluated", "fills")},
        }
        yield control_frame(e, result.dead_letters, counters, encode_updates(result.updates))

    def close(self) -> None:
        """Nothing to release: the evaluator stays cached for the next micro-batch."""
