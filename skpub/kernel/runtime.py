"""Process-level tuning for long-running engine processes.

The router and evaluators hold millions of long-lived, acyclic objects (ids,
index entries). CPython's default collector thresholds (700, 10, 10) rescan
them over and over while a micro-batch allocates its records; measured on
the GeoNames default this cost about a third of the local engine's time.
:func:`tune_gc` freezes what exists at startup and raises the first
threshold so the young generation is collected once a million container
objects more have been allocated than freed. A young collection visits
every object that grew the heap since the last one, and every object each
of them refers to, so its cost follows the growth of long-lived state (a
window filling up, subscriptions arriving), not the records a batch
allocates and frees. Measured on the ranked GeoNames benchmark (235,000
objects, 100,000-object window, 4 evaluators, local engine): 1.49 s of young
collections at 100,000, 0.47 s at 1,000,000. Reference cycles are still
collected; only less often: so rarely once in the oldest generation that the
Spark driver and the local daemon collect in full on a timer
(:class:`FullCollections`; the driver's ``skpub.app.engines.spark``
``DRIVER_COLLECT_SECONDS``: py4j's cycles hold JVM memory).
"""

from __future__ import annotations

import gc
import math
import threading
import time
from collections.abc import Callable

GEN0_THRESHOLD = 1_000_000


def tune_gc() -> None:
    """Freeze the heap once per process and raise the collector's thresholds (idempotent).

    Engines call this at the start of every micro-batch task; only the first
    call freezes. Freezing again each batch would move that batch's cyclic
    garbage into the permanent generation, where it is never collected: a
    leak that grows with the stream (seen as +11-16 MB per Python worker over
    20 batches before this was made idempotent).
    """
    if gc.get_threshold()[0] < GEN0_THRESHOLD:
        gc.collect()  # garbage frozen now would never be collected
        gc.set_threshold(GEN0_THRESHOLD, 50, 100)
        gc.freeze()


FULL_COLLECTION_SECONDS = 10.0
"""Shortest period of :class:`FullCollections` in the long-running processes (the daemons, the Spark driver)."""

STRETCH = 100
"""A full collection that took ``d`` seconds allows the next one only after ``STRETCH * d`` (1% of a core)."""


class FullCollections:
    """Full collections at most once per ``seconds``, for a long-running process under :func:`tune_gc`.

    Under the raised thresholds a reference cycle that reaches the oldest
    generation stays until a full collection, which then comes after some
    5 * 10**9 allocations net of frees: a daemon that runs for days would
    keep every cycle its HTTP requests and micro-batches made. Calling an
    instance once per micro-batch (and when idle) collects in full when
    ``seconds`` have passed since the last collection (the first call
    collects), or ``STRETCH`` times the last one's duration if longer: a
    collection walks the whole heap not frozen at startup (about 0.1 s per
    million tracked objects on 2 cores), so a large heap is collected less
    often and the collections take at most 1% of a core. Time is ``clock``
    (monotonic seconds).

    Raises
    ------
    ValueError
        If ``seconds`` is negative or not finite.
    """

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"full collection period must be a finite number of seconds >= 0, not {seconds!r}")
        self.seconds, self.clock = seconds, clock
        self.last = -math.inf  # clock() at the end of the last full collection
        self.wait = seconds  # seconds from the last collection to the next

    def __call__(self) -> bool:
        """Collect in full if the wait since the last collection is over; return whether it did."""
        if self.clock() - self.last < self.wait:
            return False
        start = self.clock()
        gc.collect()
        self.last = self.clock()
        self.wait = max(self.seconds, STRETCH * (self.last - start))
        return True


class CollectorPauses:
    """Seconds the cyclic garbage collector has taken in this process, per generation, since :func:`collector_pauses`.

    ``seconds[g]`` (float, wall seconds, ``g`` 0 to 2) sums the collections
    of generation ``g`` (a full collection is generation 2), each from its
    start callback to its stop callback (``gc.callbacks``): one
    ``perf_counter`` call at each, O(1) per collection. The interval holds
    the finalizers the collection runs, during which other threads may run
    if one releases the interpreter; otherwise the collector, in whichever
    thread allocated, holds it. Collections do not nest.
    """

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self._started: float | None = None

    def __call__(self, phase: str, info: dict) -> None:
        """Time one collection: called by ``gc.callbacks`` at its start and its stop."""
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            generation = info.get("generation", 2)
            self.seconds[min(max(generation, 0), 2)] += time.perf_counter() - self._started
            self._started = None


_PAUSES = CollectorPauses()
_PAUSES_LOCK = threading.Lock()


def collector_pauses() -> CollectorPauses:
    """Return the process's :class:`CollectorPauses`, hooked into ``gc.callbacks`` once (thread-safe)."""
    with _PAUSES_LOCK:
        if not any(hook is _PAUSES for hook in gc.callbacks):
            gc.callbacks.append(_PAUSES)
    return _PAUSES
