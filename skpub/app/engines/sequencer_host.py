"""The sequencer's host: one process per executor JVM that keeps the Spark engine's sequencer hot.

The sequencer task (:class:`skpub.app.engines.spark_tasks.SequencerTask`)
runs in whichever Python worker Spark picks; each worker kept its own copy of
the sequencer (the id registry, the object-id horizon: 80 MiB by default)
and caught it up from the checkpoint's deltas of the batches it missed. The
host (:mod:`skpub.kernel.host`) keeps one copy: the task sends it the parse
tasks' report rows and its arguments, the host runs the batch (reading the
located rows and writing the routed rows, the registry's delta and the
routing report in the checkpoint, as the task would) and returns the routed
files' rows and the sequencer's dead letters, which the task writes to the
output: a host outliving its task writes nothing there. The checkpoint stays the truth: a host that dies, or answers
with an error, costs the task a run of its own, never a result.

Run as ``python -m skpub.app.engines.sequencer_host SOCKET WATCH`` by
:func:`skpub.kernel.host.connect`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from skpub.app.engines.spark_tasks import sequencer_host_handler
from skpub.kernel.host import serve

if __name__ == "__main__":
    serve(Path(sys.argv[1]), int(sys.argv[2]), sequencer_host_handler())
