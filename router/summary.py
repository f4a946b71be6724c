"""Textual summaries per evaluator (Tornado section 3.1).

Each evaluator's summary holds one keyword per subscription clause, the
clause's least frequent (every matching object must contain it). An object is
forwarded to its owner evaluator only if one of its terms is in that
evaluator's summary; otherwise no subscription there can match it.

Keywords are reference-counted, so a keyword leaves a summary exactly when
its last subscription at that evaluator is unsubscribed. Tornado has the
evaluators report expired keywords to the routing units periodically; here
the routing unit already sees every unsubscribe (it routes them), so it
expires keywords at once and no keyword lingers.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def terms_among(terms: pa.ListArray, keys: pa.Array | None) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """Flatten lists of terms and find those among ``keys`` (every non-null term when ``keys`` is None).

    Returns
    -------
    (flat, parents, where)
        ``flat``: the terms, flattened (Arrow, null rows skipped); ``where``
        (int64, ascending): the indices into ``flat`` of the terms found;
        ``parents`` (int64, aligned with ``where``): the row of ``terms``
        each came from. One Arrow ``is_in``: O(terms + keys).
    """
    flat = pc.list_flatten(terms)  # skips null rows, whatever their offsets span
    lengths = pc.fill_null(pc.list_value_length(terms), 0).to_numpy()
    found = pc.is_valid(flat) if keys is None else pc.is_in(flat, value_set=keys)
    where = np.flatnonzero(pc.fill_null(found, False).to_numpy(zero_copy_only=False))
    return flat, np.repeat(np.arange(len(terms), dtype=np.int64), lengths)[where], where


class TextualSummaries:
    """Keyword reference counts per evaluator: ``counts[e][keyword] -> int``."""

    def __init__(self, evaluators: int) -> None:
        self.counts: list[dict[str, int]] = [{} for _ in range(evaluators)]
        self._holders: dict[str, int] = {}  # keyword -> evaluators whose summary holds it
        self._keys: pa.Array | None = None  # every held keyword, built when asked and the set changed

    def add(self, evaluator: int, keywords: Iterable[str]) -> None:
        """Count one more subscription clause keyword at ``evaluator``."""
        summary, holders = self.counts[evaluator], self._holders
        for kw in keywords:
            count = summary.get(kw, 0)
            if not count:
                held = holders.get(kw, 0)
                holders[kw] = held + 1
                if not held:
                    self._keys = None
            summary[kw] = count + 1

    def remove(self, evaluator: int, keywords: Iterable[str]) -> list[str]:
        """Count one fewer; return the keywords that expired (count reached zero)."""
        summary = self.counts[evaluator]
        expired = []
        for kw in keywords:
            left = summary[kw] - 1
            if left:
                summary[kw] = left
            else:
                del summary[kw]
                expired.append(kw)
                held = self._holders.pop(kw) - 1
                if held:
                    self._holders[kw] = held
                else:
                    self._keys = None
        return expired

    def key_array(self, value_type: pa.DataType | None = None) -> pa.Array:
        """Return every key some evaluator's summary holds, as an Arrow array (any order).

        ``value_type`` is ``pa.string()`` (the default) or ``pa.large_string()``,
        that of the terms it is compared with.

        Built again only after a key first appears in or last leaves every
        summary; O(keys) then, O(1) otherwise.
        """
        value_type = pa.string() if value_type is None else value_type
        if self._keys is None or self._keys.type != value_type:
            self._keys = pa.array(list(self._holders), value_type)
        return self._keys

    def admits(self, evaluator: int, terms: Iterable[str]) -> bool:
        """Return whether an object with ``terms`` can match a subscription at ``evaluator``."""
        return not self.counts[evaluator].keys().isdisjoint(terms)

    def admits_many(self, evaluators: np.ndarray, terms: pa.ListArray) -> np.ndarray:
        """Vectorized :meth:`admits`: one bool per object, ``terms[i]`` being object ``i``'s terms.

        Parameters
        ----------
        evaluators : ndarray, shape (n,), int
            Object ``i``'s owner evaluator, ``0 <= evaluators[i] < len(counts)``.
        terms : pyarrow ListArray or LargeListArray of string, length n
            Nulls (records that are not objects) hold no term.

        Returns
        -------
        ndarray, shape (n,), bool
            True where a term of object ``i`` is a key of
            ``counts[evaluators[i]]`` (as :meth:`admits`).

        Raises
        ------
        IndexError
            If an owner holding a candidate term is not an evaluator.

        Notes
        -----
        The terms are first looked up among every held key in Arrow
        (``is_in`` against :meth:`key_array`, built again only when that set
        changes); only the terms some summary holds (7% on the GeoNames Q2
        stream) are then looked up in their owner's summary, in Python.
        O(terms + keys) in Arrow, O(terms held somewhere) in Python.
        """
        admitted = np.zeros(len(terms), dtype=bool)
        if not len(terms) or not self._holders:
            return admitted
        flat, parents, usable = terms_among(terms, self.key_array(terms.type.value_type))
        if not len(usable):
            return admitted
        words = flat.take(pa.array(usable)).to_pylist()
        owners = np.asarray(evaluators)[parents]
        if len(owners) and (owners.min() < 0 or owners.max() >= len(self.counts)):
            raise IndexError(f"an owner outside evaluators 0..{len(self.counts) - 1}")
        owners = owners.tolist()
        counts = self.counts
        hit = np.fromiter((w in counts[e] for w, e in zip(words, owners, strict=True)), bool, len(words))
        admitted[parents[hit]] = True
        return admitted
