"""The evaluator core: one evaluator's subscriptions, matching and statistics.

Engine-free: the local engine calls it directly and the Spark stateful
processor hosts it inside an executor. Records arrive as
:class:`router.dispatch.Routed` rows in stream order.

State is kept per *state block* (``STATE_BLOCK`` x ``STATE_BLOCK`` fine cells,
keyed by the block of the subscription's first cell in this evaluator), so a
micro-batch rewrites only the blocks it changed and a migration can move
whole blocks (DESIGN "Adaptivity"). The GI^2 index is derived from the blocks
and rebuilt from them after a restart.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from evaluators.errors import EvaluatorError
from evaluators.gi2 import GI2Index
from evaluators.stats import CellCostStats
from router.dispatch import Routed
from router.grid import CellBox
from skpub.config import Deployment
from skpub.records import DeadLetter, ObjectRecord, RangeSubscription, Unsubscribe
from skpub.text import Vocabulary

STATE_BLOCK = 25
_BLOCK_ROW = 1 << 20

Delivery = tuple[int, str, str]
"""``(object position, subscription id, object id)``."""


@dataclass
class EvaluatorBatch:
    """What one evaluator emitted for one micro-batch."""

    evaluator: int
    deliveries: list[Delivery] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    stats: CellCostStats = field(default_factory=CellCostStats)
    cpu_seconds: float = 0.0


def state_block(box: CellBox) -> int:
    """Return the state-block key of a subscription with cell box ``box``."""
    return (box[1] // STATE_BLOCK) * _BLOCK_ROW + box[0] // STATE_BLOCK


class Evaluator:
    """One evaluator: range subscriptions in GI^2, per-cell costs, deliveries."""

    def __init__(self, evaluator_id: int, deployment: Deployment, vocabulary: Vocabulary) -> None:
        self.evaluator_id = evaluator_id
        self.grid_size = deployment.grid_size
        self.index = GI2Index(deployment.index_block, vocabulary)
        self.blocks: dict[int, dict[str, tuple[RangeSubscription, CellBox]]] = {}
        self.home: dict[str, int] = {}
        self.dirty: set[int] = set()

    @property
    def subscriptions(self) -> int:
        """Number of live subscriptions held."""
        return len(self.home)

    def apply_many(self, rows: Iterable[Routed], batch_id: int) -> EvaluatorBatch:
        """Apply one micro-batch's rows, in stream order.

        Returns
        -------
        EvaluatorBatch
            Deliveries ``(pos, sub, obj)``, passed-through dead letters, the
            batch's cell costs and this evaluator's thread CPU time, seconds.

        Raises
        ------
        EvaluatorError
            If a row is not for this evaluator or of an unknown record type.
        """
        start = time.thread_time()
        out = EvaluatorBatch(self.evaluator_id)
        deliveries, stats, size = out.deliveries, out.stats, self.grid_size
        match_one = self.index.match_one
        for row in rows:
            if row.evaluator != self.evaluator_id:
                raise EvaluatorError(f"row for evaluator {row.evaluator} reached {self.evaluator_id}")
            record = row.record
            if isinstance(record, ObjectRecord):
                cx, cy = row.cells[0], row.cells[1]
                matched, examined = match_one(record, cx, cy)
                stats.add(cy * size + cx, cx, cy, examined)
                for sid in matched:
                    deliveries.append((record.pos, sid, record.id))
            elif isinstance(record, RangeSubscription):
                self._insert(record, row.cells)
            elif isinstance(record, Unsubscribe):
                self._delete(record.id)
            elif isinstance(record, DeadLetter):
                out.dead_letters.append(record)
            else:
                raise EvaluatorError(f"evaluator cannot apply {type(record).__name__}")
        out.cpu_seconds = time.thread_time() - start
        return out

    def _insert(self, sub: RangeSubscription, box: CellBox) -> None:
        key = state_block(box)
        self.blocks.setdefault(key, {})[sub.id] = (sub, box)
        self.home[sub.id] = key
        self.dirty.add(key)
        self.index.insert(sub, box)

    def _delete(self, sub_id: str) -> None:
        key = self.home.pop(sub_id, None)
        if key is None:
            raise EvaluatorError(f"unsubscribe of {sub_id!r}, which evaluator {self.evaluator_id} does not hold")
        block = self.blocks[key]
        del block[sub_id]
        if not block:
            del self.blocks[key]
        self.dirty.add(key)
        self.index.delete(sub_id)

    def take_dirty_blocks(self) -> dict[int, bytes | None]:
        """Return the blocks changed since the last call, serialized; None for a removed block."""
        out = {
            key: pickle.dumps(self.blocks[key], protocol=pickle.HIGHEST_PROTOCOL) if key in self.blocks else None
            for key in self.dirty
        }
        self.dirty = set()
        return out

    @classmethod
    def restore(
        cls,
        evaluator_id: int,
        deployment: Deployment,
        vocabulary: Vocabulary,
        blocks: Mapping[int, bytes],
    ) -> Evaluator:
        """Rebuild an evaluator (and its GI^2 index) from serialized state blocks."""
        ev = cls(evaluator_id, deployment, vocabulary)
        for key, data in blocks.items():
            block = pickle.loads(data)
            ev.blocks[key] = block
            for sid, (sub, box) in block.items():
                ev.home[sid] = key
                ev.index.insert(sub, box)
        return ev
