"""Versioned JSON documents of evaluator state (never pickle: loading state must not execute it).

Range state blocks (:mod:`skpub.evaluators.evaluator`) and window segments
(:mod:`skpub.evaluators.window`) are ``{"format": FORMAT, key: [...]}``
documents; :func:`state_rows` reads one back and refuses another format.
"""

from __future__ import annotations

from typing import Any

import numpy as np
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


def json_token(text: str) -> pa.Scalar:
    """Return ``text`` as a ``large_binary`` scalar, a fixed piece of JSON text for the writers below."""
    return pa.scalar(text.encode(), pa.large_binary())


OPEN, CLOSE, COMMA, NOTHING, NULL = map(json_token, ("[", "]", ",", "", "null"))


def json_lists(items: pa.LargeListArray) -> pa.LargeBinaryArray:
    """Return each list of JSON texts as the JSON text of the list: ``[a,b,...]``."""
    return pc.binary_join_element_wise(OPEN, pc.binary_join(items, COMMA), CLOSE, NOTHING)


def json_runs(texts: pa.Array, lengths: np.ndarray) -> pa.LargeListArray:
    """Return ``texts`` cut into consecutive runs of ``lengths`` items (int array), as lists for :func:`json_lists`."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pa.LargeListArray.from_arrays(pa.array(offsets), texts)


def json_numbers(values: np.ndarray) -> pa.LargeBinaryArray:
    """Return integers, or floats as their shortest round-trip digits, as JSON texts: what orjson writes.

    ``values`` is an int or float numpy array; -0.0 is written ``-0.0`` (Arrow
    would write 0) and a float that is not finite ``null`` (as orjson writes
    NaN and the infinities). A float may be written without a fraction
    (``1`` for 1.0): the same number once read back as float64. O(len(values)) in C.
    """
    texts = pc.cast(pa.array(values), pa.large_string()).cast(pa.large_binary())
    if values.dtype.kind == "f":
        negative_zero = (values == 0) & np.signbit(values)
        if negative_zero.any():
            texts = pc.if_else(pa.array(negative_zero), json_token("-0.0"), texts)
        not_finite = ~np.isfinite(values)
        if not_finite.any():
            texts = pc.if_else(pa.array(not_finite), NULL, texts)
    return texts


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
