"""The output directory layout of SEMANTICS section 5.

``DIR/deliveries``, ``DIR/snapshots``, ``DIR/dead_letters`` and
``DIR/statistics`` each hold JSON-lines part files ``part-<batch>.jsonl``, one
per micro-batch that had something to write. A part is written atomically and
named by batch id, so a replayed batch replaces its first attempt: sinks are
idempotent per batch id.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from skpub.storage import atomic_write_text

STREAMS = ("deliveries", "snapshots", "dead_letters", "statistics")


def part_path(root: str | Path, stream: str, batch_id: int) -> Path:
    """Return the part file of ``stream`` for micro-batch ``batch_id``."""
    return Path(root) / stream / f"part-{batch_id:08d}.jsonl"


def write_part(root: str | Path, stream: str, batch_id: int, rows: Iterable[dict]) -> int:
    """Write one micro-batch's rows of ``stream`` atomically; return how many were written."""
    lines = [json.dumps(row, ensure_ascii=False) for row in rows]
    if lines:
        atomic_write_text(part_path(root, stream, batch_id), "\n".join(lines) + "\n")
    return len(lines)


def read_stream(root: str | Path, stream: str) -> list[dict]:
    """Read every part file of ``stream`` under ``root`` (order across files carries no meaning)."""
    rows = []
    for part in sorted((Path(root) / stream).glob("*.jsonl")):
        with part.open(encoding="utf-8") as fh:
            rows.extend(json.loads(line) for line in fh if line.strip())
    return rows


def prepare(root: str | Path, fresh: bool = False) -> Path:
    """Create the output directory and its stream folders; return its path.

    With ``fresh``, part files of an earlier run are removed first, so a new
    run's output is never mixed with an old one's.
    """
    root = Path(root)
    for stream in STREAMS:
        folder = root / stream
        if fresh:
            for part in folder.glob("*.jsonl"):
                part.unlink()
        folder.mkdir(parents=True, exist_ok=True)
    return root
