"""The parallel stage of routing: parse, validate, normalize and locate each line.

Everything here depends on one line and the routing epoch alone, never on the
stream before it, so engines run it in parallel: the Spark engine in one task
per input split, the local engine inline. For every line it yields either a
dead letter (SEMANTICS section 1, written straight to the sink) or a
:class:`Located` record:

- an object with its fine cell and the evaluator that owns it (Tornado
  section 3.1: the partition holding the point);
- a range subscription with every partition its rectangle overlaps (A-Grid
  neighbor search, O(N_p)), the cell box of rectangle ∩ partition for each,
  and the textual-summary keywords (one per clause, its least frequent);
- any other record as it is.

What depends on stream order (the id registry, placements, textual
summaries) is the sequencer's (:mod:`skpub.router.sequencer`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from skpub.kernel.config import Deployment
from skpub.kernel.grid import CellBox, intersect_boxes
from skpub.kernel.records import DeadLetter, ObjectRecord, RangeSubscription, Record, parse_line, stream_position
from skpub.kernel.registry import kind_of
from skpub.kernel.text import Vocabulary
from skpub.router.table import RoutingTable


@dataclass(slots=True)
class Located:
    """One valid record and where it goes, as far as one line can tell.

    ``cells`` is an object's cell as ``(cx, cy, cx, cy)`` and ``evaluator`` the
    owner of that cell (-1 for other records); ``targets`` are a range
    subscription's ``(partition, rectangle ∩ partition cell box)`` pairs and
    ``keywords`` its summary keywords; ``kind`` is the registry kind
    (:data:`skpub.kernel.registry.KINDS`).
    """

    record: Record
    kind: str
    evaluator: int = -1
    cells: CellBox | None = None
    targets: tuple[tuple[int, CellBox], ...] = ()
    keywords: frozenset[str] = frozenset()


@dataclass
class LocatedBatch:
    """The parallel stage's output for a run of lines: records in stream order, dead letters, CPU seconds."""

    items: list[Located] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    lines: int = 0
    cpu_seconds: float = 0.0


class Locator:
    """Parses and locates lines for one routing epoch (stateless between calls)."""

    def __init__(self, deployment: Deployment, vocabulary: Vocabulary, table: RoutingTable) -> None:
        self.deployment = deployment
        self.vocabulary = vocabulary
        self.table = table

    def locate_lines(self, lines: Sequence[bytes], batch_id: int, first: int = 0) -> LocatedBatch:
        """Parse and locate ``lines``, the batch's lines ``first``, ``first + 1``, ... in stream order.

        Parameters
        ----------
        lines : sequence of bytes
            Lines as read, without terminators.
        batch_id : int
            Micro-batch id; line ``first + i`` gets position
            ``stream_position(batch_id, first + i)``.

        Returns
        -------
        LocatedBatch
            Never raises for a line: one that fails unexpectedly becomes an
            ``internal_error`` dead letter. O(len(lines)) plus O(N_p) per
            range subscription and the expansion of its ``expr``.
        """
        start = time.thread_time()
        out = LocatedBatch(lines=len(lines))
        items, dead = out.items, out.dead_letters
        space, max_bytes = self.deployment.space, self.deployment.max_record_bytes
        grid, owner = self.table.grid, self.table.owner_of_cell
        for i, line in enumerate(lines, start=first):
            pos = stream_position(batch_id, i)
            try:
                record = parse_line(line, pos, space, max_bytes)
                if type(record) is ObjectRecord:
                    cx, cy = grid.cell_of(record.x, record.y)
                    items.append(Located(record, "object", owner(cx, cy), (cx, cy, cx, cy)))
                elif type(record) is DeadLetter:
                    dead.append(record)
                else:
                    items.append(self._locate(record))
            except Exception as exc:  # noqa: BLE001 - one record must never stop the run (SEMANTICS 1)
                dead.append(DeadLetter.internal_error(pos, line, exc))
        out.cpu_seconds = time.thread_time() - start
        return out

    def _locate(self, record: Record) -> Located:
        """Locate a record other than an object."""
        kind = kind_of(record)
        if kind != "subscribe":
            return Located(record, kind)
        assert isinstance(record, RangeSubscription)
        table = self.table
        box = table.grid.cell_box(record.rect)
        targets = []
        for e in table.route_cells(box):
            cells = intersect_boxes(box, table.partitioning.box(e))
            if cells is None:
                raise ValueError(f"partition {e} was routed a rectangle it does not overlap")
            targets.append((e, cells))
        return Located(record, kind, targets=tuple(targets), keywords=self.vocabulary.summary_keywords(record.dnf))
