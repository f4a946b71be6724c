"""Checkpoints of the local engine's pipeline, so a daemon restart resumes instead of replaying the whole log.

A checkpoint is the :class:`~skpub.app.engines.local.LocalPipeline` as after
one micro-batch, in one file ``checkpoint-<batch>.skpub``: a JSON header
line naming the parts and their byte lengths, then the parts, each in the
versioned JSON form the Spark engine keeps in its checkpoint and state
store (never pickle: a damaged or hostile file fails the load, it never
runs code):

- ``epoch``: the routing epoch in force (:meth:`RoutingEpoch.to_json`);
- ``registry``: the routing unit's id registry with placements and the
  watermark, its object-id horizon's hashes written from the ring as they
  lie (:func:`skpub.router.state.registry_buffers`); the textual
  summaries are derived from the placements;
- ``merge``: the ranked merge's results (:func:`skpub.evaluators.merge.results_json`);
- per evaluator its state blocks, window segments, ranked subscriptions
  with their last reports, clock and load statistics
  (:class:`~skpub.evaluators.state.EvaluatorState`, as a host message);
- with a rebalancing in flight, its transfer plan, the epoch it publishes
  and the hand-offs made so far (the documents the Spark engine writes in
  ``checkpoint/balancer/``).

A restored pipeline is the Spark engine's restart in one process: every
evaluator is rebuilt from its state (buffers from their last reports,
DESIGN "Durable state on Spark"), and the merge is a new generation, so
the evaluators report anew at their first mark; results, events and the
balancer's decisions (cost units, exact floats) are those of the
uninterrupted run. A checkpoint is written to a temporary name, fsync'd
and renamed (:func:`~skpub.kernel.storage.atomic_write_bytes`).
"""

from __future__ import annotations

from pathlib import Path

import orjson

from skpub.app.engines.local import LocalPipeline
from skpub.evaluators.errors import EvaluatorError
from skpub.evaluators.merge import RankedMerge, apply_changes, results_json
from skpub.evaluators.state import EvaluatorState, evaluator_from_state, evaluator_state
from skpub.kernel.config import Deployment
from skpub.kernel.errors import CheckpointError
from skpub.kernel.storage import BATCH, atomic_write_bytes, own_files
from skpub.kernel.text import Vocabulary
from skpub.kernel.transfer import Handoff, TransferPlan
from skpub.router.dispatch import Router
from skpub.router.epoch import RoutingEpoch
from skpub.router.state import decode_registry, registry_buffers

FORMAT = 1
"""Version of the checkpoint file; another version is never loaded."""
KEEP = 2
"""Checkpoints kept: the newest and the one before (should the newest be unreadable)."""
NAME = own_files(rf"checkpoint-(?P<batch>{BATCH})\.skpub")
"""A checkpoint's name, or (group ``temporary`` set) its name while written, or left by a save killed mid-write."""


def save(pipeline: LocalPipeline, directory: Path, batch_id: int) -> Path:
    """Write ``pipeline`` as after micro-batch ``batch_id`` to ``directory``; keep the newest :data:`KEEP`.

    Returns the file written. Raises ``OSError`` when the disk refuses
    (nothing is left under the checkpoint's name then). First the
    temporary files of saves killed mid-write (:data:`NAME`; one process
    saves to a directory) of this batch or earlier are removed: each is as
    large as a checkpoint, and a disk they filled would refuse every save
    after (a later batch's is not this save's to judge, though saves come
    at committed batches, which never go back).
    """
    parts: list[tuple[str, list[bytes | memoryview]]] = [
        ("epoch", [orjson.dumps(pipeline.epoch.to_json())]),
        ("registry", registry_buffers(pipeline.router.registry)),
        ("merge", [orjson.dumps(results_json(pipeline.merge))]),
    ]
    balancing = pipeline.balancing
    if balancing is not None and balancing.plan is not None:
        parts.append(("plan", [orjson.dumps(balancing.plan.to_json())]))
        parts.append(("next_epoch", [orjson.dumps(balancing.epoch.to_json())]))
        parts += [(f"handoff-{i}", [handoff.encode()]) for i, handoff in enumerate(balancing.handoffs)]
    for e, ev in enumerate(pipeline.evaluators):
        header, blobs = evaluator_state(ev).to_message()
        parts.append((f"evaluator-{e}", [orjson.dumps(header)]))
        parts += [(f"evaluator-{e}-{i}", [blob]) for i, blob in enumerate(blobs)]
    sizes = [[name, sum(memoryview(b).nbytes for b in buffers)] for name, buffers in parts]
    header = {"format": FORMAT, "batch": batch_id, "parts": sizes}
    path = directory / f"checkpoint-{batch_id:08d}.skpub"
    for entry in directory.iterdir() if directory.is_dir() else ():
        if (m := NAME.fullmatch(entry.name)) and m["temporary"] and int(m["batch"]) <= batch_id and entry.is_file():
            entry.unlink(missing_ok=True)
    atomic_write_bytes(path, [orjson.dumps(header) + b"\n", *(data for _, buffers in parts for data in buffers)])
    for old in sorted(checkpoints(directory))[:-KEEP]:
        checkpoints(directory)[old].unlink(missing_ok=True)
    return path


def checkpoints(directory: Path) -> dict[int, Path]:
    """Return the checkpoint files in ``directory`` by batch (skpub's names only)."""
    if not directory.is_dir():
        return {}
    named = ((NAME.fullmatch(p.name), p) for p in directory.iterdir())
    return {int(m["batch"]): p for m, p in named if m and not m["temporary"] and p.is_file()}


def load(path: Path, root: Path, deployment: Deployment, vocabulary: Vocabulary) -> tuple[LocalPipeline, int]:
    """Rebuild the pipeline saved in ``path``; return it and the micro-batch it was saved after.

    ``root`` receives the balancer's log, as for a new pipeline.

    Raises
    ------
    CheckpointError
        If the file is not a checkpoint of this format, is cut short, or a part is damaged.
    """
    try:
        with path.open("rb") as fh:
            header = orjson.loads(fh.readline(1 << 24))
            if header.get("format") != FORMAT:
                raise CheckpointError(f"{path} is not a local checkpoint of format {FORMAT}")
            parts = {}
            for name, length in header["parts"]:
                data = fh.read(int(length))
                if len(data) != int(length):
                    raise CheckpointError(f"{path} is cut short")
                parts[str(name)] = data
        epoch = RoutingEpoch.from_json(orjson.loads(parts["epoch"]))
        router = Router(deployment, vocabulary, decode_registry(parts["registry"]))
        merge = RankedMerge()
        apply_changes(merge, orjson.loads(parts["merge"]))
        evaluators = []
        for e in range(deployment.evaluators):
            message = orjson.loads(parts[f"evaluator-{e}"])
            count = sum(1 for name in parts if name.startswith(f"evaluator-{e}-"))
            state = EvaluatorState.from_message(message, [parts[f"evaluator-{e}-{i}"] for i in range(count)])
            ev = evaluator_from_state(e, deployment, vocabulary, state, durable=False)
            ev.monitor.forget_reports()  # a new merge: report anew at the first mark
            ev.ensure_partition(epoch.table.partitioning.boxes_of(e))
            evaluators.append(ev)
        pipeline = LocalPipeline(root, deployment, epoch, router, evaluators, merge)
        if "plan" in parts and pipeline.balancing is not None:
            pipeline.balancing.plan = TransferPlan.from_json(orjson.loads(parts["plan"]))
            pipeline.balancing.epoch = RoutingEpoch.from_json(orjson.loads(parts["next_epoch"]))
            count = sum(1 for name in parts if name.startswith("handoff-"))
            pipeline.balancing.handoffs = [Handoff.decode(parts[f"handoff-{i}"]) for i in range(count)]
    except (OSError, KeyError, TypeError, ValueError, EvaluatorError, orjson.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} cannot be loaded: {exc}") from None
    return pipeline, int(header["batch"])
