"""The per-batch sink of the local engine: write a batch's part files.

Writes one micro-batch's deliveries (each evaluator's, in its own order: an
object is forwarded to one evaluator, the owner of its cell, and GI^2 yields
a subscription once per object, so no (object, subscription) pair can occur
twice and nothing needs merging or sorting), dead letters (one per stream
position) and statistics as part files named by batch id, so running it again
for the same batch replaces the first attempt (idempotent per batch id).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from skpub.app.summary import BatchReport
from skpub.kernel.messages import Deliveries
from skpub.kernel.parts import delivery_lines, write_lines, write_part
from skpub.kernel.records import DeadLetter


def unique_letters(dead_letters: Iterable[DeadLetter]) -> list[DeadLetter]:
    """Return one dead letter per stream position (a record that failed in several evaluators is reported once)."""
    first: dict[int, DeadLetter] = {}
    for letter in dead_letters:
        first.setdefault(letter.pos, letter)
    return list(first.values())


def write_batch(
    root: str | Path,
    batch_id: int,
    deliveries: Iterable[Deliveries],
    dead_letters: Iterable[DeadLetter],
    statistics: list[dict],
    report: BatchReport,  # noqa: ARG001 - the sink's signature (the daemon's commits the report with them)
    events: list[dict] = (),
    snapshots: list[dict] = (),
) -> None:
    """Write one micro-batch's outputs under ``root`` (the batch is counted already: ``report``).

    Parameters
    ----------
    deliveries : iterable of Deliveries
        Per-evaluator range matches, written as they come.
    dead_letters : iterable of DeadLetter
        Written one per position.
    statistics : list of dict
        One :meth:`skpub.evaluators.stats.CellCostStats.to_json` line per evaluator.
    report : BatchReport
        The batch's counts (:func:`~skpub.app.summary.count_batch`).
    events, snapshots : list of dict
        The ranked merge's enter/exit events (in stream order per
        subscription, written after the range matches as the part of writer
        ``m``) and snapshot lines.
    """
    parts = list(deliveries)
    write_lines(root, "deliveries", batch_id, b"".join(delivery_lines(part) for part in parts))
    write_part(root, "deliveries", batch_id, events, "m")
    write_part(root, "snapshots", batch_id, snapshots)
    dead = unique_letters(dead_letters)
    write_part(root, "dead_letters", batch_id, (d.to_json() for d in dead))
    write_part(root, "statistics", batch_id, statistics)
