"""The Spark stateful processor that hosts one evaluator per grouping key.

Used as ``groupBy("evaluator").transformWithStateInPandas(EvaluatorProcessor(...))``
on the RocksDB state store (DESIGN "The Spark engine"). Its input is one row
per evaluator, ``(evaluator, path, rows)`` (:data:`~skpub.kernel.wire.ROUTED_FILE_COLUMNS`):
the file of routed rows the sequencer task wrote for it, which the evaluator
(in its host, or the worker) reads as Arrow; applying it is
:func:`skpub.evaluators.batch.apply_batch`. State per evaluator:

- ``blocks``: a MapState ``block (bigint) -> data (binary)`` with the
  evaluator's state blocks (:mod:`skpub.evaluators.evaluator`); a micro-batch
  rewrites only the blocks it changed;
- ``window``: a MapState ``segment -> data`` with the window objects it
  owns, one segment per micro-batch of arrival
  (:meth:`skpub.evaluators.window.WindowStore.take_segments`), and
  ``ranked``: ``batch -> changes`` of the topk/knn subscriptions it holds
  and their last reports, compacted beyond :data:`~skpub.evaluators.batch.RANKED_COMPACT_EVERY`
  entries; ``clock``: the stream clock (objects accepted, watermark) and
  the merge generation the evaluator last reported to. A restored
  evaluator rebuilds its buffers from the last reports
  (:meth:`~skpub.evaluators.monitor.RankedMonitor.restore`) and reports
  everything anew only to another generation of the merge;
- ``version``: a ValueState with the last micro-batch applied.

The hot :class:`~skpub.evaluators.evaluator.Evaluator` (with its GI^2
index) lives in the evaluator's host (:mod:`skpub.evaluators.host`, served
by :func:`skpub.evaluators.batch.host_handler`), or, when hosts are off or the host fails, in a
cache in this importable module keyed by (run id, evaluator). Either copy
is used only when its version equals the state store's; otherwise (another
worker served the key last time, or the batch is a replay after a failure
rolled the state back) it is rebuilt from the state store
(:func:`~skpub.evaluators.state.restore_evaluator`). Both paths apply a batch with
:func:`~skpub.evaluators.batch.apply_batch`. ``init()`` only declares state: it also runs on the
driver.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict

import pandas as pd
from pyspark import TaskContext
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from skpub.evaluators.batch import BatchInput, BatchOutcome, apply_batch, read_rows
from skpub.evaluators.errors import EvaluatorError
from skpub.evaluators.evaluator import Evaluator
from skpub.evaluators.host import host_for
from skpub.evaluators.state import EvaluatorState, restore_evaluator
from skpub.kernel.host import HostError, exchange, recv_message, send_message, use_hosts
from skpub.kernel.parts import write_lines, write_part
from skpub.kernel.records import DeadLetter
from skpub.kernel.runtime import tune_gc

CONTROL_DDL = "evaluator int, pos bigint, line string, reason string, message string, payload string, updates binary"
"""What an evaluator sends the driver: its internal-error dead letters, and one row whose ``payload`` is
the JSON of its batch counters (deliveries, cost, CPU seconds) and whose ``updates`` are its ranked
reports for the merge (:func:`~skpub.evaluators.merge.encode_updates`). Range deliveries and
statistics never travel: the evaluator writes them itself."""
_CACHE: dict[tuple[str, int], tuple[int, Evaluator]] = {}


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
        evaluator that last reported to another merge reports anew (each
        subscription's home evaluator, and the others their non-empty results).
    balancer_dir : str
        The checkpoint's balancer directory (:mod:`skpub.kernel.transfer`)
        when the balancer is on, else ``""``.

    Each evaluator runs in its host (:mod:`skpub.evaluators.host`) unless
    :func:`~skpub.kernel.host.use_hosts` says no on the driver; the worker applies a batch
    itself when its host cannot.
    """

    def __init__(
        self,
        run_id: str,
        output_root: str,
        deployment_json: str,
        evaluator_keys: list[int],
        generation: str,
        balancer_dir: str = "",
    ) -> None:
        self.run_id = run_id
        self.balancer_dir = balancer_dir
        self.output_root = output_root
        self.deployment_json = deployment_json
        self.index_of_key = {k: e for e, k in enumerate(evaluator_keys)}
        self.generation = generation
        self.hosts = use_hosts()

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the state variables (runs on executors and on the driver)."""
        self.blocks = handle.getMapState("blocks", "block bigint", "data binary")
        self.window = handle.getMapState("window", "segment bigint", "data binary")
        self.ranked = handle.getMapState("ranked", "batch bigint", "data binary")
        self.clock = handle.getValueState("clock", "accepted bigint, watermark double, generation string")
        self.version = handle.getValueState("version", "batch bigint")
        self.load = handle.getValueState("load", "data binary")

    def _state(self) -> EvaluatorState:
        """Return what the state store holds for the current key."""
        accepted, watermark, generation = self.clock.get()
        return EvaluatorState(
            self._map(self.blocks),
            self._map(self.window),
            [data for _, data in sorted(self._map(self.ranked).items())],
            (int(accepted), float(watermark), str(generation)),
            bytes(self.load.get()[0]) if self.load.exists() else None,
        )

    def _evaluator(self, e: int, version: int) -> Evaluator:
        """Return evaluator ``e`` at the state store's ``version`` (-1: none yet), from this worker's cache or rebuilt.

        The cache entry is taken out while the batch is applied (it mutates
        the evaluator) and put back only after success, so a failed attempt
        never leaves a half-applied evaluator behind for its retry.
        """
        cached = _CACHE.pop((self.run_id, e), None)
        if cached is not None and cached[0] == version:
            return cached[1]
        return restore_evaluator(e, self.deployment_json, self._state() if version >= 0 else None)

    @staticmethod
    def _map(state) -> dict[int, bytes]:  # noqa: ANN001
        return {int(k[0]): bytes(v[0]) for k, v in state.iterator()}

    def handleInputRows(self, key, rows: Iterator[pd.DataFrame], timerValues) -> Iterator[pd.DataFrame]:  # noqa: ANN001, N802, N803
        """Apply one micro-batch's rows for evaluator ``key`` (in its host if it can), save its state, emit outputs."""
        tune_gc()
        files = set(
            pd.concat(list(rows), ignore_index=True)[["path", "rows", "partition"]].itertuples(index=False, name=None)
        )
        if len(files) != 1:
            raise EvaluatorError(f"evaluator key {key[0]} got {len(files)} files of routed rows, not one")
        ((rows_path, rows_count, partition),) = files
        batch = BatchInput(
            self.run_id,
            self.index_of_key[int(key[0])],
            current_batch_id(),
            self.version.get()[0] if self.version.exists() else -1,
            self.generation,
            self.deployment_json,
            sum(1 for _ in self.ranked.keys()),
            rows_path,
            int(rows_count),
            self.balancer_dir,
            partition,
        )
        outcome = None
        if self.hosts:
            try:
                outcome = self._via_host(batch)
                _CACHE.pop((self.run_id, batch.evaluator), None)
            except Exception as exc:  # noqa: BLE001 - whatever the host did, the worker can apply the batch
                print(
                    f"skpub: evaluator {batch.evaluator} applies batch {batch.batch_id} itself: {exc}", file=sys.stderr
                )
        evaluator = None
        if outcome is None:
            rows = read_rows(batch)  # first: a bad file fails the task before a rebuild
            start = time.thread_time()
            evaluator = self._evaluator(batch.evaluator, batch.version)
            restore = time.thread_time() - start
            outcome = apply_batch(evaluator, rows, batch, restore)
        start = time.thread_time()
        _save(self.blocks, outcome.blocks)
        _save(self.window, outcome.window)
        if outcome.compacted is not None:
            for old in [int(k[0]) for k in self.ranked.keys()]:
                self.ranked.removeKey((old,))
            self.ranked.updateValue((batch.batch_id,), (outcome.compacted,))
        elif outcome.ranked is not None:
            self.ranked.updateValue((batch.batch_id,), (outcome.ranked,))
        self.clock.update(outcome.clock)
        if outcome.load is not None:
            self.load.update((outcome.load,))
        self.version.update((batch.batch_id,))
        if evaluator is not None:
            _CACHE[(self.run_id, batch.evaluator)] = (batch.batch_id, evaluator)
        outcome.counters["state_cpu_seconds"] += time.thread_time() - start
        outcome.counters["hosted"] = evaluator is None
        start = time.thread_time()
        writer = f"e{batch.evaluator:03d}"
        write_lines(self.output_root, "deliveries", batch.batch_id, outcome.deliveries, writer)
        write_part(self.output_root, "statistics", batch.batch_id, [outcome.statistics], writer)
        outcome.counters["sink_cpu_seconds"] = time.thread_time() - start
        yield control_frame(batch.evaluator, outcome.dead_letters, outcome.counters, outcome.updates)

    def _via_host(self, batch: BatchInput) -> BatchOutcome:
        """Apply the batch in the evaluator's host (it reads the rows), sending it the state store's state if it asks.

        Raises
        ------
        HostError
            If the host cannot be reached or fails (:class:`~skpub.kernel.host.HostError`).
        """
        with exchange(host_for(batch.evaluator)) as sock:
            send_message(sock, {"op": "apply", **asdict(batch)})
            header, blobs = recv_message(sock)
            if header.get("status") == "restore":
                state_header, state_blobs = self._state().to_message()
                send_message(sock, state_header, state_blobs)
                header, blobs = recv_message(sock)
            if header.get("status") != "ok":
                raise HostError(f"the evaluator host failed: {header.get('message')}")
            return BatchOutcome.from_message(header, blobs)

    def close(self) -> None:
        """Nothing to release: the evaluator stays cached (or in its host) for the next micro-batch."""
