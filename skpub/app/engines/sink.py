"""The per-batch sink shared by every engine: merge, write, report.

Writes one micro-batch's deliveries (through the merger), dead letters (in
stream order) and statistics as part files named by batch id, so running it
again for the same batch replaces the first attempt (idempotent per batch id).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from skpub.app.output import write_part
from skpub.app.summary import BatchReport
from skpub.evaluators.merge import merge_deliveries
from skpub.kernel.messages import Delivery
from skpub.kernel.records import DeadLetter


def write_batch(
    root: str | Path,
    batch_id: int,
    deliveries: Iterable[Iterable[Delivery]],
    dead_letters: Iterable[DeadLetter],
    statistics: list[dict],
    report: BatchReport,
) -> BatchReport:
    """Write one micro-batch's outputs under ``root`` and complete ``report``.

    Parameters
    ----------
    deliveries : iterable of iterables of (pos, sub, obj)
        Per-evaluator deliveries (merged and deduplicated here).
    dead_letters : iterable of DeadLetter
        Written in stream-position order, one per position (a record that
        failed in several evaluators is reported once).
    statistics : list of dict
        One :meth:`skpub.evaluators.stats.CellCostStats.to_json` line per evaluator.
    report : BatchReport
        The router's counters; evaluator loads, deliveries and dead letters
        are filled in here.
    """
    merged = merge_deliveries(deliveries)
    dead: list[DeadLetter] = []
    for letter in sorted(dead_letters, key=lambda d: d.pos):
        if not dead or dead[-1].pos != letter.pos:
            dead.append(letter)
    write_part(root, "deliveries", batch_id, merged)
    write_part(root, "dead_letters", batch_id, (d.to_json() for d in dead))
    write_part(root, "statistics", batch_id, statistics)
    report.deliveries = len(merged)
    report.dead_letters = Counter(d.reason for d in dead)
    for row in statistics:
        report.evaluator_cost[row["evaluator"]] = row["cost"]
        report.evaluator_cpu[row["evaluator"]] = row["cpu_seconds"]
    return report
