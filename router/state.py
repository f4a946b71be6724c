"""The routing unit's durable state: id-registry bases and per-batch journals.

The Spark engine persists, per micro-batch, the registry's changes (a
journal, O(batch)) and every few batches the whole registry (a base), so
a replayed batch starts from exactly the state its first attempt saw (DESIGN
"What skpub 0.1 does differently"). Both are JSON documents
``{"format": FORMAT, "kind": ..., ...}``, a registry's followed by a newline
and its object-id horizon's hashes, raw (``16 n`` bytes,
:meth:`~skpub.kernel.horizon.ObjectIdHorizon.hash_buffers`: at the default
horizon of 10^6 ids, 16 MB written from the ring as it lies, where base64
inside the JSON cost ~100 MB of transient buffers per checkpoint that the
allocator kept). Loading them parses data and never executes it, and a
document of another format version or kind is refused with
:class:`~skpub.kernel.errors.CheckpointError`.
"""

from __future__ import annotations

import orjson

from skpub.kernel.errors import CheckpointError
from skpub.kernel.registry import Change, IdRegistry
from skpub.router.sequencer import Placement

FORMAT = 5
"""5: a registry's horizon hashes raw after its JSON line (4: base64 inside it; 3: the ids; both still read)."""
READABLE = (3, 4, 5)
_RTYPES = frozenset(("object", "subscribe", "unsubscribe", "snapshot", "clock", "place"))


def registry_buffers(registry: IdRegistry) -> list[bytes | memoryview]:
    """Return the whole registry as byte buffers to write in order: a JSON line, then the horizon's hashes.

    The hash buffers are views of the registry's horizon (no copy): write
    them before it accepts more objects. :func:`decode_registry` reads their
    concatenation.
    """
    head = orjson.dumps({"format": FORMAT, "kind": "registry", "registry": registry.to_json(Placement.to_json)})
    return [head + b"\n", *registry.objects.hash_buffers()]


def encode_registry(registry: IdRegistry) -> bytes:
    """Return :func:`registry_buffers` joined into one bytes object."""
    return b"".join(registry_buffers(registry))


def decode_registry(data: bytes) -> IdRegistry:
    """Rebuild a registry from :func:`encode_registry` output (or a format 3 or 4 JSON document).

    Raises
    ------
    CheckpointError
        If the bytes are not such a document of a readable format version.
    """
    end = data.find(b"\n")
    doc = _document(data if end < 0 else data[:end], "registry")
    if doc["format"] < 5:
        if end >= 0:
            raise CheckpointError(f"router registry of format {doc['format']} followed by other bytes")
        return IdRegistry.from_json(doc["registry"], Placement.from_json)
    if end < 0:
        raise CheckpointError("router registry of format 5 without its horizon's hashes")
    return IdRegistry.from_json(doc["registry"], Placement.from_json, memoryview(data)[end + 1 :])


def encode_journal(changes: list[Change]) -> bytes:
    """Return one micro-batch's registry changes as a versioned JSON document (encoded in C by orjson).

    Object ids are kept apart, in order, as one list (they are the volume, and
    their namespace is their own, so they replay in bulk); the other changes
    keep their order.
    """
    objects = [rid for rtype, rid, _ in changes if rtype == "object"]
    others = [change for change in changes if change[0] != "object"] if len(objects) < len(changes) else []
    doc = {"format": FORMAT, "kind": "journal", "objects": objects, "changes": others}
    return orjson.dumps(doc, default=_placement_json)


def _placement_json(value: object) -> list:
    """Encode for orjson what it cannot encode itself: placements and their keyword sets."""
    if isinstance(value, Placement):
        return value.to_json()
    if isinstance(value, frozenset):
        return sorted(value)
    raise TypeError(f"a registry change cannot hold {type(value).__name__}")


def decode_journal(data: bytes) -> tuple[list[str], list[Change]]:
    """Rebuild the ``(object ids, other changes)`` of :func:`encode_journal`.

    Apply them with :meth:`IdRegistry.replay_objects` and :meth:`IdRegistry.replay`.

    Raises
    ------
    CheckpointError
        If the bytes are not such a document of this format version.
    """
    doc = _document(data, "journal")
    try:
        objects = doc["objects"]
        if not isinstance(objects, list) or not all(type(oid) is str for oid in objects):
            raise TypeError("object ids must be a list of strings")
        changes = []
        for rtype, rid, placement in doc["changes"]:
            if rtype not in _RTYPES or rtype == "object" or not isinstance(rid, str):
                raise ValueError(f"bad change {rtype!r}")
            if rtype == "clock":
                changes.append((rtype, rid, placement))
            elif rtype in ("subscribe", "place") and placement is None:
                raise ValueError(f"a {rtype} change of {rid!r} without its placement")
            else:
                changes.append((rtype, rid, None if placement is None else Placement.from_json(placement)))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"damaged registry journal: {exc}") from None
    return objects, changes


def _document(data: bytes, kind: str) -> dict:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise CheckpointError(f"router state is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("kind") != kind:
        raise CheckpointError(f"router state is not a {kind} document")
    if doc.get("format") not in READABLE:
        raise CheckpointError(f"router {kind} has format {doc.get('format')!r}; this skpub reads formats {READABLE}")
    return doc
