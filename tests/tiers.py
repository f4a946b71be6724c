"""Test tiers: what the fast tier runs before every commit, and what only the whole suite runs.

``pytest -m "not slow"`` is the fast tier (2-4 minutes on 2 cores with ``-n 2``; the README gives the figures),
``pytest --hypothesis-profile=ci -n 2`` the whole suite (plain ``pytest`` runs every test with the ``dev`` profile's
examples). A test is ``slow`` when it starts its own JVM or ``skpub serve`` process, runs
a batch-size-1 grid or a soak, or takes more than a few seconds; the fast tier keeps at least one case of every
differential test (every kind, both engines, a router at batch size 1, ``chaos``), so a grid is split with
:func:`tiered`: the cases named fast run in both tiers, the others in the whole suite only. Nothing leaves the
suite: a case is only moved to the slow tier.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable

import pytest

SLOW = pytest.mark.slow


def tiered(cases: Iterable[tuple], fast: Collection[tuple]) -> list:
    """Return ``cases`` as parametrize values, each one not in ``fast`` marked ``slow``.

    Raises
    ------
    ValueError
        If a case of ``fast`` is not among ``cases`` (a representative that would silently not run).
    """
    cases = list(cases)
    missing = set(fast) - set(cases)
    if missing:
        raise ValueError(f"fast cases not in the grid: {sorted(missing, key=str)}")
    return [case if case in fast else pytest.param(*case, marks=SLOW) for case in cases]


def grid(*axes: Iterable, fast: Collection[tuple]) -> list:
    """Return the product of ``axes`` as :func:`tiered` cases."""
    return tiered(itertools.product(*axes), fast)


def case_id(value: object) -> str | None:
    """A readable test id for a grid value: a window as its kind and size (``count30``), others as pytest makes them."""
    from skpub.kernel.config import Window

    return f"{value.kind}{value.size:g}" if isinstance(value, Window) else None
