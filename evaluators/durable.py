"""Versioned JSON documents of evaluator state (never pickle: loading state must not execute it).

Range state blocks (:mod:`skpub.evaluators.evaluator`) and window segments
(:mod:`skpub.evaluators.window`) are ``{"format": FORMAT, key: [...]}``
documents; :func:`state_rows` reads one back and refuses another format.
"""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

FORMAT = 1
"""Format of the evaluator state documents."""


def state_document(rows: list, key: str) -> bytes:
    """Return ``{"format": FORMAT, key: rows}`` as JSON bytes."""
    return orjson.dumps({"format": FORMAT, key: rows})


def state_documents_of(rows: pa.LargeListArray, key: str) -> pa.LargeBinaryArray:
    """Return, for each list of rows given as their JSON texts, the document ``{"format": FORMAT, key: rows}``.

    The JSON value :func:`state_document` gives for the decoded rows, built
    in Arrow. ``key`` must need no JSON escaping.
    """
    head = pa.scalar(b'{"format":%d,"%s":[' % (FORMAT, key.encode()), pa.large_binary())
    comma, tail = pa.scalar(b",", pa.large_binary()), pa.scalar(b"]}", pa.large_binary())
    return pc.binary_join_element_wise(head, pc.binary_join(rows, comma), tail, pa.scalar(b"", pa.large_binary()))


def state_rows(data: bytes, key: str) -> Any:
    """Return the ``key`` entry of a :func:`state_document`.

    Raises
    ------
    ValueError
        If ``data`` is not JSON (``orjson.JSONDecodeError`` is one) or is of another format.
    KeyError, AttributeError
        If it is not such a document.
    """
    doc = orjson.loads(data)
    if doc.get("format") != FORMAT:
        raise ValueError(f"format {doc.get('format')!r}, this skpub reads format {FORMAT}")
    return doc[key]
