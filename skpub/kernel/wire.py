"""The columnar wire format of routed rows (router -> evaluators).

Engines that move :class:`skpub.kernel.messages.Routed` rows between processes
(Spark's shuffle) send them as columns: :func:`to_columns` and
:func:`from_columns` convert losslessly, using plain Python lists so the
format is testable without Spark. :data:`COLUMNS` gives every column's
name and Spark SQL type, in order.

``rtype`` codes: 0 object, 1 range subscription, 2 unsubscribe, 3 dead
letter. For an object, ``cells`` is ``(cx, cy, cx, cy)``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from skpub.kernel.geometry import Rect
from skpub.kernel.messages import Routed
from skpub.kernel.records import DeadLetter, ObjectRecord, RangeSubscription, Unsubscribe

OBJECT, SUBSCRIBE, UNSUBSCRIBE, DEAD_LETTER = 0, 1, 2, 3

COLUMNS: tuple[tuple[str, str], ...] = (
    ("evaluator", "int"),
    ("pos", "bigint"),
    ("rtype", "tinyint"),
    ("id", "string"),
    ("x", "double"),
    ("y", "double"),
    ("terms", "array<string>"),
    ("ts", "double"),
    ("expires_at", "double"),
    ("cx0", "int"),
    ("cy0", "int"),
    ("cx1", "int"),
    ("cy1", "int"),
    ("rect", "array<double>"),
    ("dnf", "string"),
    ("line", "string"),
    ("reason", "string"),
    ("message", "string"),
)
NAMES = tuple(name for name, _ in COLUMNS)


def ddl() -> str:
    """Return the Spark DDL schema string of the wire format."""
    return ", ".join(f"{name} {kind}" for name, kind in COLUMNS)


def to_columns(rows: Sequence[Routed], evaluator_keys: Sequence[int]) -> dict[str, list]:
    """Convert routed rows to columns; ``evaluator`` holds ``evaluator_keys[row.evaluator]``."""
    cols: dict[str, list] = {name: [None] * len(rows) for name in NAMES}
    for i, row in enumerate(rows):
        rec = row.record
        cols["evaluator"][i] = evaluator_keys[row.evaluator]
        cols["pos"][i] = rec.pos
        if row.cells is not None:
            cols["cx0"][i], cols["cy0"][i], cols["cx1"][i], cols["cy1"][i] = row.cells
        if isinstance(rec, ObjectRecord):
            cols["rtype"][i] = OBJECT
            cols["id"][i], cols["x"][i], cols["y"][i] = rec.id, rec.x, rec.y
            cols["terms"][i], cols["ts"][i], cols["expires_at"][i] = list(rec.terms), rec.ts, rec.expires_at
        elif isinstance(rec, RangeSubscription):
            cols["rtype"][i], cols["id"][i] = SUBSCRIBE, rec.id
            cols["rect"][i] = rec.rect.as_list()
            cols["dnf"][i] = json.dumps([sorted(clause) for clause in rec.dnf], ensure_ascii=False)
        elif isinstance(rec, Unsubscribe):
            cols["rtype"][i], cols["id"][i] = UNSUBSCRIBE, rec.id
        else:
            cols["rtype"][i] = DEAD_LETTER
            cols["line"][i], cols["reason"][i], cols["message"][i] = rec.line, rec.reason, rec.message
    return cols


def _optional_float(value) -> float | None:  # noqa: ANN001 - pandas gives NaN for nulls
    return None if value is None or value != value else float(value)


def from_columns(cols: Mapping[str, Sequence], evaluator: int) -> list[Routed]:
    """Rebuild routed rows for ``evaluator`` from columns, in stream order."""
    rows = []
    for i in sorted(range(len(cols["pos"])), key=cols["pos"].__getitem__):
        rtype, pos = int(cols["rtype"][i]), int(cols["pos"][i])
        cells = None
        if rtype in (OBJECT, SUBSCRIBE):
            cells = (int(cols["cx0"][i]), int(cols["cy0"][i]), int(cols["cx1"][i]), int(cols["cy1"][i]))
        if rtype == OBJECT:
            terms = tuple(cols["terms"][i])
            record = ObjectRecord(
                pos,
                cols["id"][i],
                float(cols["x"][i]),
                float(cols["y"][i]),
                terms,
                frozenset(terms),
                _optional_float(cols["ts"][i]),
                _optional_float(cols["expires_at"][i]),
            )
        elif rtype == SUBSCRIBE:
            dnf = tuple(frozenset(clause) for clause in json.loads(cols["dnf"][i]))
            record = RangeSubscription(pos, cols["id"][i], Rect(*(float(v) for v in cols["rect"][i])), dnf)
        elif rtype == UNSUBSCRIBE:
            record = Unsubscribe(pos, cols["id"][i])
        else:
            record = DeadLetter(pos, cols["line"][i], cols["reason"][i], cols["message"][i])
        rows.append(Routed(evaluator, record, cells))
    return rows
