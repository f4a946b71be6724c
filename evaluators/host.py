"""The evaluator host: one process per evaluator and executor JVM that keeps the evaluator hot.

Spark hands a task to whichever of its Python workers is free, so the task
of evaluator e often lands in another worker than the one that applied e's
last micro-batch, which must then rebuild e from the state store (on
``local[2]`` that was half of the tasks, about a second each on the 100k
window of benchmark (e)). The host (:mod:`skpub.kernel.host`) holds e across
micro-batches: the worker sends it the file of the batch's routed rows (the
sequencer task wrote it) and the state store's version, the host reads and
applies them (rebuilding e first, from state the worker sends, only when its
copy is not of that version) and returns what the worker writes to the state
store (:func:`skpub.evaluators.batch.host_handler`). The state
store stays the truth: a host that dies, or answers with an error, costs a
rebuild, never a result (the worker then applies the batch itself). The host
writes no output itself: the task writes what it returns.

Run as ``python -m skpub.evaluators.host SOCKET WATCH`` by
:func:`skpub.kernel.host.connect`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from skpub.kernel.host import HostAddress, serve, watched_pid


def host_for(evaluator: int) -> HostAddress:
    """Return the address of evaluator ``evaluator``'s host for this executor."""
    return HostAddress(f"e{evaluator}", watched_pid(), "skpub.evaluators.host")


if __name__ == "__main__":
    from skpub.evaluators.batch import host_handler

    serve(Path(sys.argv[1]), int(sys.argv[2]), host_handler())
