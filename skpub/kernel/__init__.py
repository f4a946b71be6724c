"""The kernel: what every layer shares, importing nothing above it.

- :mod:`~skpub.kernel.records`, :mod:`~skpub.kernel.decode`: input lines into
  records or dead letters (SEMANTICS sections 1-3).
- :mod:`~skpub.kernel.geometry`, :mod:`~skpub.kernel.grid`: rectangles and the
  fine grid.
- :mod:`~skpub.kernel.text`: term normalization, ``expr`` to DNF, vocabulary.
- :mod:`~skpub.kernel.config`: the deployment.
- :mod:`~skpub.kernel.registry`, :mod:`~skpub.kernel.horizon`: the id
  registry and its object-id horizon (SEMANTICS section 1).
- :mod:`~skpub.kernel.messages`, :mod:`~skpub.kernel.wire`: the messages that
  cross layers and their columnar form.
- :mod:`~skpub.kernel.oracle`, :mod:`~skpub.kernel.oracle_records`: the
  brute-force reference of SEMANTICS, with its own reading of records, ids,
  expressions and idf (it imports none of the modules above but config and
  geometry; an import-linter contract keeps it so).
- :mod:`~skpub.kernel.inputs`, :mod:`~skpub.kernel.storage`,
  :mod:`~skpub.kernel.runtime`, :mod:`~skpub.kernel.errors`: reading input,
  atomic writes, the garbage collector, the error hierarchy.
"""
