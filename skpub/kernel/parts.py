"""Part files of the output streams (SEMANTICS section 5): names, encoding, reading.

``DIR/<stream>/part-<batch>.jsonl`` or ``part-<batch>-<writer>.jsonl``: one
file per micro-batch and writer (a Spark parse task ``p<n>``, the sequencer
``s``, an evaluator ``e<n>``, the driver ``d``; the merge ``m`` on both
engines), written atomically and named
by batch id, so a replayed batch rewrites exactly the same files (idempotent
per batch id). The batch id has :data:`PART_DIGITS` digits, so names sort
in batch order for any 64-bit id (as Kafka names its segments); skpub
before 2026-11-29 wrote eight (``part-00000042.jsonl``, and more digits
past batch 99,999,999, where name order broke): such parts are still read,
and a batch written again replaces its eight-digit parts (a run resumed
across the upgrade). Every task that produces output writes its own parts, in
parallel; nothing is sorted globally, because range matches and dead letters
carry no order (SEMANTICS section 5). Who may create or remove them is
:mod:`skpub.app.output`'s business.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from skpub.kernel.messages import Deliveries
from skpub.kernel.storage import BATCH, atomic_write_bytes, entries, own_files

STREAMS = ("deliveries", "snapshots", "dead_letters", "statistics", "balancer")
PART_DIGITS = 20
"""Digits of the batch id in a part file's name: every 64-bit id, zero-padded."""
PART_RE = own_files(rf"part-(?P<batch>\d{{{PART_DIGITS}}}|{BATCH})(?:-(?P<writer>[a-z]\d{{0,4}}))?\.jsonl")
"""A part file's name (or its temporary name): ``batch`` and ``writer`` (None for a stream's one writer)."""


def part_path(root: str | Path, stream: str, batch_id: int, writer: str = "") -> Path:
    """Return the part file of ``stream`` for micro-batch ``batch_id`` written by ``writer`` ("" for one writer)."""
    suffix = f"-{writer}" if writer else ""
    return Path(root) / stream / f"part-{batch_id:0{PART_DIGITS}d}{suffix}.jsonl"


def _eight_digit_path(root: str | Path, stream: str, batch_id: int, writer: str = "") -> Path:
    """Return the name skpub before 2026-11-29 gave :func:`part_path`'s file (eight digits at least)."""
    suffix = f"-{writer}" if writer else ""
    return Path(root) / stream / f"part-{batch_id:08d}{suffix}.jsonl"


def _parts(named: Iterable[Path]) -> dict[tuple[int, str], Path]:
    """Map ``(batch, suffix)`` to each part among ``named`` (temporary names left out), a current name over an older.

    ``suffix`` is what follows the batch id (``-e1.jsonl``, ``.jsonl``): sorted by it, a batch's parts come in
    the order their names always sorted in.
    """
    found: dict[tuple[int, str], Path] = {}
    for path in named:
        match = PART_RE.fullmatch(path.name)
        if match is None or match["temporary"]:
            continue
        key = (int(match["batch"]), path.name[match.end("batch") :])
        if key not in found or len(match["batch"]) == PART_DIGITS:
            found[key] = path
    return found


def batch_parts(root: str | Path, stream: str, batch_id: int) -> list[Path]:
    """Return micro-batch ``batch_id``'s part files of ``stream``: the one writer's, then each writer's by name.

    A batch written under both names (eight digits, then :data:`PART_DIGITS`, the first attempt by an older
    skpub) gives each part once, under the current name.
    """
    folder = Path(root) / stream
    if not folder.is_dir():
        return []
    names = {f"part-{batch_id:08d}", f"part-{batch_id:0{PART_DIGITS}d}"}
    parts = _parts(p for name in names for p in [*folder.glob(f"{name}.jsonl"), *folder.glob(f"{name}-*.jsonl")])
    return [parts[key] for key in sorted(parts, key=lambda key: (key[1] != ".jsonl", key[1]))]  # one writer's first


def rename_eight_digit_parts(root: str | Path) -> int:
    """Give each part of ``root``'s streams that an older skpub named with eight digits its current name.

    What a run resumed across the upgrade does before it writes, so that
    its directory sorts by name in batch order again. A part whose current
    name exists already (a batch written again since) is dropped: the
    current one replaced it. Regular files only, never through a link;
    idempotent (a resume killed half-way does the rest the next time).
    Returns how many parts were renamed or dropped; O(parts).

    Raises
    ------
    OSError
        If a folder cannot be listed, or a part renamed or removed.
    """
    done = 0
    for stream in STREAMS:
        folder = Path(root) / stream
        if not folder.is_dir() or folder.is_symlink():
            continue
        for path, kind in entries(folder):
            match = PART_RE.fullmatch(path.name)
            if kind != "file" or match is None or match["temporary"] or len(match["batch"]) == PART_DIGITS:
                continue
            current = part_path(root, stream, int(match["batch"]), match["writer"] or "")
            if current.exists():
                path.unlink()
            else:
                os.replace(path, current)
            done += 1
    return done


def write_lines(root: str | Path, stream: str, batch_id: int, data: bytes, writer: str = "") -> None:
    """Write ``data`` (complete JSON lines, UTF-8) as one part file atomically; nothing when empty.

    The part's eight-digit name, where a first attempt by skpub before 2026-11-29 left it, is removed after.
    """
    path = part_path(root, stream, batch_id, writer)
    if data:
        atomic_write_bytes(path, data)
    older = _eight_digit_path(root, stream, batch_id, writer)
    if older != path:
        older.unlink(missing_ok=True)


def write_part(root: str | Path, stream: str, batch_id: int, rows: Iterable[dict], writer: str = "") -> int:
    """Write JSON rows as one part file atomically (nothing when there are none); return how many."""
    lines = [orjson.dumps(row) for row in rows]
    write_lines(root, stream, batch_id, b"\n".join(lines) + b"\n" if lines else b"", writer)
    return len(lines)


def delivery_lines(deliveries: Deliveries) -> bytes:
    """Encode range matches as delivery lines ``{"sub":..,"obj":..,"event":"match"}``, one per match, in order.

    Each distinct id is JSON-encoded once (orjson, in Python), then the
    lines are joined in Arrow (``binary_join_element_wise``): O(deliveries)
    in C plus O(distinct ids) in Python.
    """
    if not len(deliveries):
        return b""
    lines = pc.binary_join_element_wise(
        _MATCH_PARTS[0], json_strings(deliveries.sub), _MATCH_PARTS[1], json_strings(deliveries.obj),
        _MATCH_PARTS[2], _EMPTY,
    )  # fmt: skip
    _, offsets, data = lines.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int64)[lines.offset : lines.offset + len(lines) + 1]
    return data.to_pybytes()[bounds[0] : bounds[-1]]


_MATCH_PARTS = tuple(pa.scalar(part, pa.large_binary()) for part in (b'{"sub":', b',"obj":', b',"event":"match"}\n'))
_EMPTY = pa.scalar(b"", pa.large_binary())


def json_strings(ids: pa.Array) -> pa.LargeBinaryArray:
    r"""Return each string of ``ids`` (plain or dictionary-encoded) as its JSON text, each distinct one encoded once.

    The text orjson writes: a string without ``"``, ``\`` or a control
    character (below U+0020) is itself between quotes, joined in Arrow;
    only the others are encoded by orjson, in Python.
    """
    encoded = ids if pa.types.is_dictionary(ids.type) else pc.dictionary_encode(ids)
    names = encoded.dictionary.cast(pa.large_string())
    texts = pc.binary_join_element_wise(_QUOTE, names, _QUOTE, _NO_TEXT).cast(pa.large_binary())
    escaped = pc.match_substring_regex(names, _NEEDS_ESCAPE)
    if pc.any(escaped).as_py():  # only those go through Python
        fixed = pa.array([orjson.dumps(s) for s in names.filter(escaped).to_pylist()], pa.large_binary())
        texts = pc.replace_with_mask(texts, escaped, fixed)
    return texts.take(encoded.indices)


_QUOTE = pa.scalar('"', pa.large_string())
_NO_TEXT = pa.scalar("", pa.large_string())
_NEEDS_ESCAPE = r'["\\\x00-\x1f]'
"""A character JSON writes escaped (RE2): a quote, a backslash, a control character."""


def read_batches(root: str | Path, stream: str) -> dict[int, list[dict]]:
    """Read every part file of ``stream`` under ``root`` (skpub's names): each batch's rows in writer order."""
    batches: dict[int, list[dict]] = {}
    parts = _parts((Path(root) / stream).glob("part-*.jsonl"))
    for key in sorted(parts):
        with parts[key].open(encoding="utf-8") as fh:
            batches.setdefault(key[0], []).extend(json.loads(line) for line in fh if line.strip())
    return batches


def read_stream(root: str | Path, stream: str) -> list[dict]:
    """Read every part file of ``stream`` under ``root`` (skpub's names) in batch order, then writer order."""
    return [row for rows in read_batches(root, stream).values() for row in rows]
