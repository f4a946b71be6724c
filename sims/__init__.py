"""Workloads for runs, tests, benchmarks and ``skpub simulate``.

- :mod:`skpub.sims.geonames`: the GeoNames workload (Tornado section 5, PS2Stream VI-A): real places as objects,
  sampled range, topk and knn subscriptions, and its skew variants: the drifting hot spot (``drift_scale``,
  Tornado 5.4's spatially condensed data) and the keyword burst (``burst_regions``, PS2Stream VI-D's switching
  regions).

``sims/scenarios/`` (data, not modules) holds the shipped ``skpub simulate`` scenarios, one JSON file each
(:func:`shipped_scenarios` lists them: nothing else names them all). The simulations themselves run in the
application shell (:mod:`skpub.app.simulate`, :mod:`skpub.app.report`).
"""

from importlib import resources

SCENARIOS = resources.files("skpub.sims") / "scenarios"
"""The shipped scenarios' folder (package data: ``SCENARIOS / "drift.json"``)."""


def shipped_scenarios() -> list[str]:
    """Return the names of the scenarios shipped in :data:`SCENARIOS`, sorted."""
    return sorted(p.name.removesuffix(".json") for p in SCENARIOS.iterdir() if p.name.endswith(".json"))
