"""An evaluator's whole state as the Spark engine's state store keeps it, and back.

:class:`EvaluatorState` is what a restart needs of one evaluator: its
range subscriptions in state blocks, its window objects in segments (one
per micro-batch of arrival), its ranked subscriptions with their last
reports, its clock and its load statistics, each a versioned JSON document
(:mod:`skpub.evaluators.durable`). The Spark engine keeps it entry by entry
in the state store (:mod:`skpub.evaluators.spark_processor`) and sends it
to evaluator hosts as a message; the local engine's checkpoints hold it
whole (:func:`evaluator_state`). :func:`restore_evaluator` rebuilds an
evaluator from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from skpub.evaluators.evaluator import Evaluator
from skpub.evaluators.monitor import RankedMonitor
from skpub.evaluators.window import encode_segment, segments_of
from skpub.kernel.config import Deployment, deployment_from_text
from skpub.kernel.text import Vocabulary, load_vocabulary


@dataclass
class EvaluatorState:
    """An evaluator's entries in the state store: blocks, window segments, ranked changes in order, clock, load.

    ``load`` is the load statistics' document (:meth:`~skpub.evaluators.load.CellLoad.to_document`), None when
    the balancer is off.
    """

    blocks: dict[int, bytes]
    window: dict[int, bytes]
    ranked: list[bytes]
    clock: tuple[int, float, str]
    load: bytes | None = None

    def to_message(self) -> tuple[dict, list[bytes]]:
        """Return the state as a host message (header and blobs; the load, when kept, is the last blob)."""
        header = {"blocks": list(self.blocks), "window": list(self.window), "clock": list(self.clock),
                  "load": self.load is not None}  # fmt: skip
        load = [self.load] if self.load is not None else []
        return header, [*self.blocks.values(), *self.window.values(), *self.ranked, *load]

    @classmethod
    def from_message(cls, header: dict, blobs: list[bytes]) -> EvaluatorState:
        """Rebuild the state of :meth:`to_message`."""
        nb, nw = len(header["blocks"]), len(header["window"])
        blobs, load = (blobs[:-1], blobs[-1]) if header["load"] else (blobs, None)
        return cls(
            dict(zip(map(int, header["blocks"]), blobs[:nb], strict=True)),
            dict(zip(map(int, header["window"]), blobs[nb : nb + nw], strict=True)),
            blobs[nb + nw :],
            clock_of(header["clock"]),
            load,
        )


def clock_of(raw: list) -> tuple[int, float, str]:
    """Rebuild a clock ``(objects accepted, watermark in seconds, generation)`` from a host message.

    JSON has no infinity: orjson writes the watermark of an evaluator that
    has seen no object yet (-inf) as null, which reads back as -inf.
    """
    accepted, watermark, generation = raw
    return int(accepted), -math.inf if watermark is None else float(watermark), str(generation)


def restore_evaluator(e: int, deployment_json: str, state: EvaluatorState | None) -> Evaluator:
    """Rebuild evaluator ``e`` of a Spark task from its state-store entries (None: a new evaluator)."""
    deployment = deployment_from_text(deployment_json)
    vocabulary = load_vocabulary(deployment.vocabulary, deployment.vocabulary_digest)
    if state is None:
        return Evaluator(e, deployment, vocabulary, durable=True)
    return evaluator_from_state(e, deployment, vocabulary, state)


def evaluator_from_state(
    e: int, deployment: Deployment, vocabulary: Vocabulary, state: EvaluatorState, durable: bool = True
) -> Evaluator:
    """Rebuild evaluator ``e`` from ``state``; ``durable``: it keeps its changes for the state store (Spark).

    O(subscriptions + window objects + reported entries).

    Raises
    ------
    EvaluatorError
        On damaged state.
    """
    evaluator = Evaluator.restore(e, deployment, vocabulary, state.blocks, state.load, durable)
    accepted, watermark, generation = state.clock
    clock = (accepted, watermark)
    evaluator.monitor = RankedMonitor.restore(e, deployment, vocabulary, clock, state.window, state.ranked, durable)
    evaluator.monitor.generation = generation
    return evaluator


def evaluator_state(ev: Evaluator) -> EvaluatorState:
    """Return evaluator ``ev``'s whole state (what the state store would hold after its last batch).

    Every state block, one segment per batch of its window objects'
    arrival, its ranked subscriptions and last reports as one compaction,
    its clock and load statistics. O(subscriptions + window objects) time
    and bytes.
    """
    store = ev.monitor.store
    held = store.held()
    return EvaluatorState(
        ev.encode_blocks(),
        {segment: encode_segment(cols) for segment, cols in segments_of(held)} if held is not None else {},
        [ev.monitor.subscriptions_json()],
        (store.accepted, store.watermark, ev.monitor.generation),
        ev.load.to_document() if ev.load.kept else None,
    )
