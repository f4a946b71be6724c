"""Benchmark (i): PS2Stream Definition 1's coefficients, measured on skpub's evaluator (docs/benchmarks.md (i)).

``L = c1 |candidate pairs| + c2 |O| + c3 |Q^i| + c4 |Q^d|`` (skpub counts GI^2
candidates for PS2Stream's |O| |Q|, :mod:`skpub.router.workload`). Each
coefficient is the thread CPU of one evaluator applying rows of one kind,
in microseconds, and relative to ``c2`` (the unit of
:class:`skpub.router.workload.LoadModel`):

- c2: an object whose terms meet no subscription key (parse nothing: the
  evaluator's row loop, the cell lookup, the statistics);
- c1: per candidate examined, from objects that meet ``S`` subscriptions
  filed under their term but outside their rectangles, less c2;
- c3: a range subscription inserted (GI^2 entries, state block, load count);
- c4: an unsubscribe (lazy deletion, state block, load count).

Run: python -m benchmarks.workload [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from skpub.evaluators.evaluator import Evaluator
from skpub.kernel.config import Deployment
from skpub.kernel.geometry import Rect
from skpub.kernel.messages import Routed
from skpub.kernel.records import ObjectRecord, RangeSubscription, Unsubscribe
from skpub.kernel.text import Vocabulary
from skpub.kernel.wire import routed_rows_table

SPACE = Rect(0, 0, 1000, 1000)
N = 20_000
S = 50


def _cpu(ev: Evaluator, rows: list[Routed]) -> float:
    table = routed_rows_table(rows)
    start = time.thread_time()
    ev.apply_many(table, 0)
    return time.thread_time() - start


def measure() -> dict[str, float]:
    """Return the coefficients in microseconds per unit."""
    dep = Deployment(space=SPACE, grid_size=1000)
    ev = Evaluator(0, dep, Vocabulary())
    subs = [
        Routed(0, RangeSubscription(i, f"s{i}", Rect(0, 0, 1, 1), (frozenset({"k"}),)), (0, 0, 0, 0)) for i in range(N)
    ]
    c3 = _cpu(ev, subs) / N
    plain = [
        Routed(0, ObjectRecord(N + i, f"o{i}", 500.5, 500.5, ("z",), frozenset({"z"})), (500, 500, 500, 500), i + 1)
        for i in range(N)
    ]
    c2 = _cpu(ev, plain) / N
    ev2 = Evaluator(0, dep, Vocabulary())
    far = [
        Routed(0, RangeSubscription(i, f"f{i}", Rect(0.1, 0.1, 0.2, 0.2), (frozenset({"k"}),)), (0, 0, 0, 0))
        for i in range(S)
    ]
    ev2.apply_many(routed_rows_table(far), 0)
    near = [
        Routed(0, ObjectRecord(S + i, f"n{i}", 0.5, 0.5, ("k",), frozenset({"k"})), (0, 0, 0, 0), i + 1)
        for i in range(N)
    ]
    c1 = (_cpu(ev2, near) / N - c2) / S
    gone = [Routed(0, Unsubscribe(2 * N + i, f"s{i}"), None) for i in range(N)]
    c4 = _cpu(ev, gone) / N
    return {"c1": c1 * 1e6, "c2": c2 * 1e6, "c3": c3 * 1e6, "c4": c4 * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    runs = [measure() for _ in range(args.repeat)]
    medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"(i) Definition 1 on skpub's evaluator, median of {args.repeat}:")
    for k, us in medians.items():
        print(f"  {k}: {us:8.3f} us = {us / medians['c2']:.2f} c2")


if __name__ == "__main__":
    main()
