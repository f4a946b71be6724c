"""The daemon of the Python workers Spark starts: PySpark's own, importing PySpark from its installed package.

Spark puts its ``pyspark.zip`` first on every Python worker's path. Python
compiles a module imported from a zip anew in each process (zipimport keeps
no bytecode), so each daemon paid about 0.5 s of CPU importing PySpark, and
each worker it forked about 0.07 s more for the modules a task needs (about
17 s of a sparse quick run's CPU went to imports, docs/benchmarks.md (u)).
When that zip is the installed PySpark package's own copy
(``<site>/pyspark/python/lib/pyspark.zip`` beside ``<site>/pyspark``), the
two hold the same code, and this daemon takes the zip off its path before
anything imports PySpark, so PySpark comes from the package and its cached
bytecode; the workers it forks inherit that path, and no cached importer of
the zip (which ``importlib.invalidate_caches``, run by Spark before every
task, would read again: about 16 ms a task). Any other zip (a Spark
distribution's, or an executor without PySpark installed) stays where Spark
put it. Then it runs PySpark's daemon unchanged
(``spark.python.daemon.module``; :func:`~skpub.app.engines.spark.spark_session`).

Run as ``python -m skpub.app.engines.spark_daemon WORKER_MODULE`` by Spark.
"""

from __future__ import annotations

import sys
from importlib.machinery import PathFinder
from pathlib import Path

PYSPARK_ZIP = ("python", "lib", "pyspark.zip")
"""Where the PySpark package keeps the zip Spark puts on its workers' path, inside the package's folder."""


def without_own_zip(path: list[str]) -> list[str]:
    """Return ``path`` (a ``sys.path``) without PySpark's zip if it is the copy inside the PySpark package found there.

    The package is looked for on ``path`` without its zip entries
    (``PathFinder``, nothing imported); only ``<package>/python/lib/pyspark.zip``
    of that very package is taken off. O(len(path)) file-system lookups.
    """
    spec = PathFinder.find_spec("pyspark", [p for p in path if not p.endswith(".zip")])
    if spec is None or not spec.submodule_search_locations:
        return list(path)
    own = Path(next(iter(spec.submodule_search_locations)), *PYSPARK_ZIP).resolve()
    return [p for p in path if not (p.endswith(".zip") and Path(p).resolve() == own)]


def _main() -> None:
    kept = without_own_zip(sys.path)
    for entry in set(sys.path) - set(kept):
        # finding this module cached a zipimporter for the zip: Spark's worker calls importlib.invalidate_caches()
        # before every task, which re-reads the directory of every cached zip (about 16 ms for pyspark.zip)
        sys.path_importer_cache.pop(entry, None)
    sys.path[:] = kept
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    _main()
