"""Part files of the output streams (SEMANTICS section 5): names, encoding, reading.

``DIR/<stream>/part-<batch>.jsonl`` or ``part-<batch>-<writer>.jsonl``: one
file per micro-batch and writer (a Spark parse task ``p<n>``, the sequencer
``s``, an evaluator ``e<n>``, the driver ``d``), written atomically and named
by batch id, so a replayed batch rewrites exactly the same files (idempotent
per batch id). Every task that produces output writes its own parts, in
parallel; nothing is sorted globally, because range matches and dead letters
carry no order (SEMANTICS section 5). Who may create or remove them is
:mod:`skpub.app.output`'s business.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import orjson

from skpub.kernel.messages import Delivery
from skpub.kernel.storage import BATCH, atomic_write_bytes, own_files

STREAMS = ("deliveries", "snapshots", "dead_letters", "statistics", "balancer")
PART_RE = own_files(rf"part-(?P<batch>{BATCH})(?:-(?P<writer>[a-z]\d{{0,4}}))?\.jsonl")
_MATCH_LINE = b'{"sub":%b,"obj":%b,"event":"match"}\n'


def part_path(root: str | Path, stream: str, batch_id: int, writer: str = "") -> Path:
    """Return the part file of ``stream`` for micro-batch ``batch_id`` written by ``writer`` ("" for one writer)."""
    suffix = f"-{writer}" if writer else ""
    return Path(root) / stream / f"part-{batch_id:08d}{suffix}.jsonl"


def batch_parts(root: str | Path, stream: str, batch_id: int) -> list[Path]:
    """Return micro-batch ``batch_id``'s part files of ``stream``, in name order (every writer's; no temporary name)."""
    folder = Path(root) / stream
    if not folder.is_dir():
        return []
    return sorted(folder.glob(f"part-{batch_id:08d}.jsonl")) + sorted(folder.glob(f"part-{batch_id:08d}-*.jsonl"))


def write_lines(root: str | Path, stream: str, batch_id: int, data: bytes, writer: str = "") -> None:
    """Write ``data`` (complete JSON lines, UTF-8) as one part file atomically; nothing when empty."""
    if data:
        atomic_write_bytes(part_path(root, stream, batch_id, writer), data)


def write_part(root: str | Path, stream: str, batch_id: int, rows: Iterable[dict], writer: str = "") -> int:
    """Write JSON rows as one part file atomically (nothing when there are none); return how many."""
    lines = [orjson.dumps(row) for row in rows]
    write_lines(root, stream, batch_id, b"\n".join(lines) + b"\n" if lines else b"", writer)
    return len(lines)


def delivery_lines(deliveries: Iterable[Delivery]) -> bytes:
    """Encode range matches ``(pos, sub, obj)`` as delivery lines ``{"sub", "obj", "event": "match"}``.

    Each distinct id is JSON-encoded once (orjson), so a dense batch costs one
    bytes formatting per delivery. O(deliveries); the order is kept.
    """
    encoded: dict[str, bytes] = {}
    dumps = orjson.dumps
    out = []
    for _, sub, obj in deliveries:
        s = encoded.get(sub)
        if s is None:
            s = encoded[sub] = dumps(sub)
        o = encoded.get(obj)
        if o is None:
            o = encoded[obj] = dumps(obj)
        out.append(_MATCH_LINE % (s, o))
    return b"".join(out)


def read_stream(root: str | Path, stream: str) -> list[dict]:
    """Read every part file of ``stream`` under ``root`` (skpub's names) in batch order, then writer order."""
    rows = []
    named = ((m, p) for p in (Path(root) / stream).glob("part-*.jsonl") if (m := PART_RE.fullmatch(p.name)))
    for _, _, part in sorted((int(m["batch"]), part.name, part) for m, part in named if not m["temporary"]):
        with part.open(encoding="utf-8") as fh:
            rows.extend(json.loads(line) for line in fh if line.strip())
    return rows
