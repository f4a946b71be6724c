"""Hypothesis profiles: how many examples a property test draws comes from here, not from each test.

Three profiles are registered (``settings.register_profile``):

- ``dev`` (the default): :data:`DEV_EXAMPLES` examples per unit of weight,
  for the fast tier a developer runs before every commit
  (``pytest -m "not slow"``);
- ``ci``: :data:`CI_EXAMPLES` per unit, what the whole suite runs in CI
  (``pytest --hypothesis-profile=ci``, the README's test command);
- ``deep``: :data:`DEEP_EXAMPLES` per unit, for a long hunt on one test
  (``pytest tests/test_hostile.py::test_... --hypothesis-profile=deep``).

``HYPOTHESIS_PROFILE`` in the environment chooses one too; pytest's
``--hypothesis-profile`` wins over both. A test states only its *weight*,
how many units of examples it is worth (:func:`examples`): a cheap parse
property 15, a property that runs a whole engine per example 0.1; the
profile scales them all at once. ``--hypothesis-seed=N`` replays a run.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

DEV_EXAMPLES = 10
"""Examples per unit of weight in the ``dev`` profile."""
CI_EXAMPLES = 100
"""Examples per unit of weight in the ``ci`` profile (hypothesis's own default)."""

DEEP_EXAMPLES = 5000
"""Examples per unit of weight in the ``deep`` profile (50 times ``ci``)."""

settings.register_profile("dev", max_examples=DEV_EXAMPLES, deadline=None)
settings.register_profile("ci", max_examples=CI_EXAMPLES, deadline=None, print_blob=True)
settings.register_profile("deep", max_examples=DEEP_EXAMPLES, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def examples(weight: float, **overrides) -> settings:  # noqa: ANN003
    """Return settings drawing ``weight`` times the loaded profile's examples (at least one).

    Read when a test module is imported, after pytest loaded the profile of
    ``--hypothesis-profile``; ``overrides`` are other settings (a health
    check to suppress, ``stateful_step_count``).
    """
    count = max(1, round(settings.default.max_examples * weight))
    return settings(max_examples=count, **overrides)


TOO_SLOW = [HealthCheck.too_slow]
"""The health check a test whose examples each run an engine suppresses."""
