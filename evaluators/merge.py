"""The merger: one ordered, duplicate-free delivery stream per micro-batch.

An object is owned by one evaluator, so a (subscription, object) pair is
matched once; the merger still removes duplicates, because replication and
migration (DESIGN "Adaptivity") can create them, and orders deliveries by
object stream position, then subscription id.
"""

from __future__ import annotations

from collections.abc import Iterable

from skpub.kernel.messages import Delivery


def merge_deliveries(parts: Iterable[Iterable[Delivery]]) -> list[dict]:
    """Merge per-evaluator deliveries ``(pos, sub, obj)`` into output lines.

    Returns
    -------
    list of dict
        ``{"sub", "obj", "event": "match"}`` in (position, subscription) order,
        each (object position, subscription) pair once: an object id that
        recurs after the id horizon is a new object and matches again
        (SEMANTICS section 1). O(d log d) for d deliveries.
    """
    out = []
    last = None
    for pos, sub, obj in sorted(d for part in parts for d in part):
        if (pos, sub) != last:
            last = (pos, sub)
            out.append({"sub": sub, "obj": obj, "event": "match"})
    return out
