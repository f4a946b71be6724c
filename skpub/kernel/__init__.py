"""The kernel: what every layer shares, importing nothing above it.

Input and records (SEMANTICS sections 1-3):

- :mod:`~skpub.kernel.inputs`: reading input: a JSON-lines file, a directory of them, or standard input, as bytes.
- :mod:`~skpub.kernel.slices`: an input's micro-batches as byte ranges of its files, read in place (the Spark source).
- :mod:`~skpub.kernel.decode`: one line into a JSON value under the hostile-input rules (SEMANTICS 1).
- :mod:`~skpub.kernel.records`: typed input records and their validation, or a dead letter (SEMANTICS 1).
- :mod:`~skpub.kernel.objects`: object lines decoded in bulk into columns: the fast lane of parsing.
- :mod:`~skpub.kernel.text`: term normalization, tokenization, ``expr`` to DNF, the vocabulary (SEMANTICS 2, 3.1).
- :mod:`~skpub.kernel.registry`: the id registry: ``duplicate_id``, ``unknown_id`` and placements (SEMANTICS 1).
- :mod:`~skpub.kernel.horizon`: the object-id horizon: the last N accepted object ids as keyed hashes (SEMANTICS 1).

Space and deployment:

- :mod:`~skpub.kernel.geometry`: closed axis-aligned rectangles and points (SEMANTICS 2).
- :mod:`~skpub.kernel.grid`: the fine grid FG (Tornado section 3.1): points and rectangles to cells.
- :mod:`~skpub.kernel.config`: the deployment (space, window, evaluators, router, grids, balancer), with its bounds.

What crosses layers:

- :mod:`~skpub.kernel.messages`: the typed messages router -> evaluators -> sink (``Routed``, ``Delivery``, ``Mark``,
  ``RankedUpdate``).
- :mod:`~skpub.kernel.wire`: the columnar (Arrow) wire format of records between engine stages.
- :mod:`~skpub.kernel.load`: load summaries, what an evaluator tells the balancer each batch (Tornado 4.3, Figure 5;
  PS2Stream V-A's grid^t blocks).
- :mod:`~skpub.kernel.transfer`: a rebalancing's cell transfer as durable documents: moves, plans, hand-offs
  (Tornado 4.4 over micro-batches).
- :mod:`~skpub.kernel.parts`: part files of the output streams: names, encoding, reading (SEMANTICS 5).

The reference:

- :mod:`~skpub.kernel.oracle`: the brute-force oracle, a direct replay of SEMANTICS.
- :mod:`~skpub.kernel.oracle_records`: the oracle's own reading of records, ids, terms, expressions and idf
  (it imports none of the engines' parsing, registry or text modules; an import-linter contract keeps it so).

Processes and files:

- :mod:`~skpub.kernel.storage`: atomic file writes (a temporary name, then a rename).
- :mod:`~skpub.kernel.host`: hosts: long-lived processes beside a Spark executor that keep a task's state between
  micro-batches.
- :mod:`~skpub.kernel.runtime`: process tuning: the garbage collector's thresholds, timed full collections, pauses.
- :mod:`~skpub.kernel.errors`: the exception hierarchy (:class:`~skpub.kernel.errors.SkpubError`).
"""
