"""Text: term normalization, tokenization, boolean expressions and the vocabulary.

Implements ``docs/SEMANTICS.md`` section 2 (terms) and section 3.1 (the AND/OR
expression grammar). A boolean expression is kept in disjunctive normal form
(DNF): a tuple of clauses, each a frozenset of terms that must all be present.
This is the form GI^2 indexes (PS2Stream section IV-C: one inverted list entry
per conjunctive clause, on its least frequent keyword).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import unicodedata
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import pairwise, product
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from skpub.kernel.errors import ConfigError, ExpressionError

if TYPE_CHECKING:
    from skpub.kernel.config import Deployment

TOKEN_RE = re.compile(r"\w+")
EXPR_TOKEN_RE = re.compile(r"\(|\)|[^\s()]+")
MAX_DNF_CLAUSES = 256
MAX_EXPR_DEPTH = 32
MAX_DNF_TERMS = 16_384
"""Most terms an ``expr`` expansion may hold over all its clauses (skpub decision, docs/SEMANTICS.md)."""

DNF = tuple[frozenset[str], ...]


_NORMALIZED: dict[str, str] = {}
_SEPARATOR = "\x00"
MAX_CACHED_TERMS = 1 << 16
MAX_CACHED_TERM_LENGTH = 64
MAX_VOCABULARY_BYTES = 256 << 20
"""Largest vocabulary file read, bytes (GeoNames' is a few MiB); a larger one is refused, not read to its end."""


def _normalize(term: str) -> str:
    """NFKC, casefold, NFKC (SEMANTICS section 2), unmemoized."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", term).casefold())


def normalize_term(term: str) -> str:
    """Normalize one term: NFKC, then casefold, then NFKC again (SEMANTICS section 2).

    Memoized in a plain dict of at most ``MAX_CACHED_TERMS`` terms whose
    text and normalization both hold at most ``MAX_CACHED_TERM_LENGTH``
    characters, so the memo's memory is bounded whatever the stream holds; a full memo is emptied and refills
    with the terms in use now (workloads repeat terms heavily, and the set
    they repeat drifts). For ASCII the result is ``term.lower()`` (NFKC
    leaves ASCII unchanged and casefold is lower there), which
    :func:`normalize_each` uses as a fast path.
    """
    norm = _NORMALIZED.get(term)
    if norm is None:
        norm = _normalize(term)
        if len(term) <= MAX_CACHED_TERM_LENGTH and len(norm) <= MAX_CACHED_TERM_LENGTH:
            if len(_NORMALIZED) >= MAX_CACHED_TERMS:
                _NORMALIZED.clear()
            _NORMALIZED[term] = norm
    return norm


def tokenize(text: str) -> list[str]:
    r"""Split ``text`` into ``\w+`` tokens and normalize each; empty terms are dropped."""
    return normalize_terms(TOKEN_RE.findall(text))


def normalize_terms(terms: Iterable[str]) -> list[str]:
    """Normalize each element of a ``terms`` list as one term (not split); drop empty ones.

    Raises
    ------
    TypeError
        If an element is not a string.
    """
    out = normalize_each(terms if type(terms) is list else list(terms))
    return out if "" not in out else [t for t in out if t]


def normalize_each(terms: list[str]) -> list[str]:
    """Return the normalization of every element of ``terms``, aligned with it (empty results kept).

    The list is joined with NUL (a normalization boundary that casefold and
    NFKC leave alone) and checked in C: an all-ASCII list is lowered in one
    pass (NFKC leaves ASCII as it is and casefold is lower there). Other
    lists go term by term: ASCII terms lowered, the others through the memo
    of :func:`normalize_term`. O(total characters); callers pass whole
    micro-batches to pay the checks once.

    Raises
    ------
    TypeError
        If an element is not a string.
    """
    if not terms:
        return []
    joined = _SEPARATOR.join(terms)
    if joined.isascii() and joined.count(_SEPARATOR) == len(terms) - 1:
        return joined.lower().split(_SEPARATOR)
    cache = _NORMALIZED
    return [term.lower() if term.isascii() else cache.get(term) or normalize_term(term) for term in terms]


_PLAIN_CANDIDATES = ((0x0000, 0x2FFF), (0x3000, 0x9FFF), (0xAC00, 0xD7A3))
"""Where :func:`plain_characters` looks: scripts, symbols, CJK ideographs and Hangul syllables (the rest is never
plain, which only sends it to the exact path in Python)."""


PAIRED_PLANES_END = 0x20000
"""Every two-character canonical decomposition is of a code point below this (planes 0 and 1)."""
_HANGUL_FOLLOWERS = (*range(0x1161, 0x1176), *range(0x11A8, 0x11C3))
"""Hangul vowel and trailing jamo: they compose with the jamo or syllable before them by the algorithm of Unicode
section 3.12, which ``unicodedata.decomposition`` does not list."""


def _composition_followers() -> set[int]:
    """Return the code points that may compose with the character before them.

    The second of every two-character canonical decomposition, and the
    Hangul vowel and trailing jamo: a superset of NFC_QC=Maybe's starters
    and of the combining marks that compose. Canonical pairs lie in planes
    0 and 1 (plane 2's decompositions are single characters); a test checks
    that on the running Python's ``unicodedata``.
    """
    followers = set(_HANGUL_FOLLOWERS)
    for code in range(PAIRED_PLANES_END):
        mapping = unicodedata.decomposition(chr(code))
        if mapping and not mapping.startswith("<"):
            parts = mapping.split()
            if len(parts) == 2:
                followers.add(int(parts[1], 16))
    return followers


@lru_cache(maxsize=1)
def plain_characters() -> frozenset[str]:
    """Return the characters whose terms Arrow's ``utf8_lower`` normalizes exactly as SEMANTICS section 2 does.

    A character ``c`` is *plain* if NFKC leaves it as it is, its canonical
    decomposition starts with a starter (combining class 0) that is not the
    second character of any canonical pair, ``casefold(c)`` is one such
    character too, and Arrow's ``utf8_lower`` of ``c`` equals
    ``casefold(c)``. For a term of plain characters alone, then, NFKC
    changes nothing (composition can only join a starter to a following
    character that is a pair's second, and reordering never crosses a
    starter), casefold is the concatenation of each character's (it has no
    context), the second NFKC changes nothing again, and ``utf8_lower``
    (one code point for one, without context, checked here on every
    character and on a final sigma) gives the same string. Computed once per
    process from the running Python's ``unicodedata`` and the installed
    Arrow (about 0.4 s), so a newer Unicode in either is checked, not
    assumed. Empty if Arrow lowers with context.
    """
    if pc.utf8_lower(pa.array(["ΟΔΟΣ"])).to_pylist() != ["οδοσ"]:
        return frozenset()
    followers = _composition_followers()
    normalize, combining = unicodedata.normalize, unicodedata.combining
    stable = set()  # NFKC leaves it, and its decomposition starts with a starter that composes with nothing before
    for lo, hi in _PLAIN_CANDIDATES:
        for ch in map(chr, range(lo, hi + 1)):
            first = normalize("NFD", ch)[:1]
            if normalize("NFKC", ch) == ch and not combining(first) and ord(first) not in followers:
                stable.add(ch)
    chars = [ch for ch in stable if ch.casefold() in stable]  # folds to one stable character
    lowered = pc.utf8_lower(pa.array(chars, pa.large_string())).to_pylist()
    return frozenset(ch for ch, low in zip(chars, lowered, strict=True) if low == ch.casefold())


@lru_cache(maxsize=1)
def _not_plain_pattern() -> str | None:
    """Return an RE2 pattern that finds a character outside :func:`plain_characters` (None: none is plain)."""
    plain = sorted(map(ord, plain_characters()))
    if not plain:
        return None
    ranges, lo = [], plain[0]
    for before, code in pairwise(plain):
        if code != before + 1:
            ranges.append((lo, before))
            lo = code
    ranges.append((lo, plain[-1]))
    return "[^" + "".join(f"\\x{{{a:x}}}-\\x{{{b:x}}}" if a != b else f"\\x{{{a:x}}}" for a, b in ranges) + "]"


def normalize_array(terms: Sequence[str] | pa.Array) -> pa.LargeStringArray:
    """Return the normalization of every element of ``terms`` as an Arrow array, aligned with it (empty kept).

    The same result as :func:`normalize_each`, for a whole micro-batch's
    object terms (a list of str, or an Arrow string array): ASCII terms are
    lowered in Arrow (``ascii_lower``, which on ASCII is what NFKC,
    casefold, NFKC give), and so are the other terms made of
    :func:`plain_characters` alone (``utf8_lower``; most Latin, Greek,
    Cyrillic, CJK and Hangul words); each distinct remaining term is
    normalized once, in Python, without the memo of :func:`normalize_term`
    (a batch of GeoNames names holds more distinct non-ASCII terms than the
    memo keeps, and a miss costs about 4x a plain normalization: 0.5
    against 0.13 us). O(total characters) in C plus O(distinct other terms)
    in Python.

    Raises
    ------
    pyarrow.ArrowInvalid, pyarrow.ArrowTypeError
        If an element is not a string (or is null).
    """
    array = terms.cast(pa.large_string()) if isinstance(terms, pa.Array) else pa.array(terms, pa.large_string())
    if array.null_count:
        raise pa.ArrowInvalid("a term is null")
    ascii = pc.string_is_ascii(array)
    lowered = pc.ascii_lower(array)
    if ascii.false_count == 0:
        return lowered
    others = pc.invert(ascii)
    return pc.replace_with_mask(lowered, others, _normalize_non_ascii(array.filter(others)))


def _normalize_non_ascii(terms: pa.LargeStringArray) -> pa.LargeStringArray:
    """Normalize terms that are not all ASCII: ``utf8_lower`` where all characters are plain, else in Python."""
    pattern = _not_plain_pattern()
    if pattern is None:
        return _normalize_distinct(terms)
    hard = pc.match_substring_regex(terms, pattern)
    lowered = pc.utf8_lower(terms)
    if hard.true_count == 0:
        return lowered
    return pc.replace_with_mask(lowered, hard, _normalize_distinct(terms.filter(hard)))


def _normalize_distinct(terms: pa.LargeStringArray) -> pa.LargeStringArray:
    """Normalize each distinct term of ``terms`` once, in Python; return all of them, aligned."""
    distinct = terms.dictionary_encode()  # the distinct terms and where each is, one pass
    normalized = pa.array([_normalize(term) for term in distinct.dictionary.to_pylist()], pa.large_string())
    return normalized.take(distinct.indices)


def parse_expression(expr: str) -> DNF:
    """Parse an AND/OR keyword expression into disjunctive normal form.

    Grammar (SEMANTICS section 3.1): ``expr := conj (OR conj)*``,
    ``conj := atom (AND atom)*``, ``atom := TERM | "(" expr ")"``. The words AND
    and OR are operators in any letter case; every other run of non-space,
    non-parenthesis characters is one operand, normalized as a term.

    The expression is first parsed into a tree (at most ``MAX_EXPR_DEPTH``
    nested parentheses), then the size of its expansion is counted on the
    tree (AND-clauses: a sum over OR, a product over AND; and terms over all
    clauses), and only an expression within ``MAX_DNF_CLAUSES`` clauses and
    ``MAX_DNF_TERMS`` terms is expanded. Time and memory are O(len(expr) +
    ``MAX_DNF_TERMS``), plus O(``MAX_DNF_CLAUSES`` x ``MAX_DNF_TERMS``) subset
    tests to drop absorbed clauses, whatever the input.

    Returns
    -------
    tuple of frozenset of str
        The clauses of the DNF, deduplicated; an object matches iff its term set
        contains every term of at least one clause. Empty when the expression has
        no operand (the caller reports ``empty_keywords``).

    Raises
    ------
    ExpressionError
        If the expression does not parse (two operands side by side, a dangling
        operator, unbalanced parentheses, an operand that normalizes to nothing),
        nests parentheses deeper than ``MAX_EXPR_DEPTH`` or its expansion would
        exceed ``MAX_DNF_CLAUSES`` AND-clauses or ``MAX_DNF_TERMS`` terms.
    """
    tokens = EXPR_TOKEN_RE.findall(expr)
    if not tokens:
        return ()
    parser = _ExprParser(tokens)
    tree = parser.parse_or(0)
    if parser.pos != len(tokens):
        raise ExpressionError(f"unexpected {_token(tokens[parser.pos])} at token {parser.pos + 1}")
    clauses, terms = _expansion_size(tree)
    if clauses > MAX_DNF_CLAUSES:
        raise ExpressionError(f"expression expands to more than {MAX_DNF_CLAUSES} AND-clauses")
    if terms > MAX_DNF_TERMS:
        raise ExpressionError(f"expression expands to more than {MAX_DNF_TERMS} terms over all its AND-clauses")
    return _minimize(_expand(tree))


_Tree = str | tuple
"""A parsed expression: a normalized term, or ``("and" | "or", [children])``."""


@dataclass
class _ExprParser:
    """Recursive descent over the tokens; recursion depth is bounded by ``MAX_EXPR_DEPTH``."""

    tokens: list[str]
    pos: int = 0

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _is_op(self, word: str) -> bool:
        tok = self._peek()
        return tok is not None and len(tok) <= 3 and tok.upper() == word

    def parse_or(self, depth: int) -> _Tree:
        children = [self.parse_and(depth)]
        while self._is_op("OR"):
            self.pos += 1
            children.append(self.parse_and(depth))
        return children[0] if len(children) == 1 else ("or", children)

    def parse_and(self, depth: int) -> _Tree:
        children = [self.parse_atom(depth)]
        while self._is_op("AND"):
            self.pos += 1
            children.append(self.parse_atom(depth))
        return children[0] if len(children) == 1 else ("and", children)

    def parse_atom(self, depth: int) -> _Tree:
        tok = self._peek()
        if tok is None:
            raise ExpressionError("expression ends where an operand was expected")
        if tok == "(":
            if depth >= MAX_EXPR_DEPTH:
                raise ExpressionError(f"parentheses nested deeper than {MAX_EXPR_DEPTH}")
            self.pos += 1
            inner = self.parse_or(depth + 1)
            if self._peek() != ")":
                raise ExpressionError("missing closing parenthesis")
            self.pos += 1
            return inner
        if tok == ")" or self._is_op("AND") or self._is_op("OR"):
            raise ExpressionError(f"unexpected {_token(tok)} at token {self.pos + 1}")
        self.pos += 1
        term = tok.lower() if tok.isascii() else normalize_term(tok)
        if not term:
            raise ExpressionError(f"operand {_token(tok)} normalizes to an empty term")
        return term


def _token(tok: str) -> str:
    return repr(tok) if len(tok) <= 40 else f"{tok[:40]!r}..."


def _expansion_size(tree: _Tree) -> tuple[int, int]:
    """Return (AND-clauses, terms over all clauses) of the expansion of ``tree``, without building it.

    OR adds both; AND multiplies the clause counts, and each child's terms
    appear once per combination of the other children's clauses. Both are
    capped just above their limits, so the arithmetic stays small; O(tree size).
    """
    if isinstance(tree, str):
        return 1, 1
    op, children = tree
    sizes = [_expansion_size(child) for child in children]
    if op == "or":
        clauses = min(sum(c for c, _ in sizes), MAX_DNF_CLAUSES + 1)
        return clauses, min(sum(t for _, t in sizes), MAX_DNF_TERMS + 1)
    clauses, terms = 1, 0
    for c, t in sizes:
        clauses, terms = min(clauses * c, MAX_DNF_CLAUSES + 1), min(terms * c + t * clauses, MAX_DNF_TERMS + 1)
    return clauses, terms


def _expand(tree: _Tree) -> list[frozenset[str]]:
    """Return the DNF clauses of ``tree``; only called when :func:`_expansion_size` is within the limits."""
    if isinstance(tree, str):
        return [frozenset((tree,))]
    op, children = tree
    parts = [_expand(child) for child in children]
    if op == "or":
        return [clause for part in parts for clause in part]
    return [frozenset().union(*combo) for combo in product(*parts)]


def _minimize(clauses: list[frozenset[str]]) -> DNF:
    """Drop duplicate clauses and clauses that contain another clause (absorption)."""
    unique = sorted(set(clauses), key=lambda c: (len(c), sorted(c)))
    kept: list[frozenset[str]] = []
    for clause in unique:
        if not any(k <= clause for k in kept):
            kept.append(clause)
    return tuple(kept)


def dnf_matches(dnf: DNF, terms: frozenset[str]) -> bool:
    """Return whether the term set satisfies the DNF (some clause is a subset)."""
    return any(clause <= terms for clause in dnf)


def _vocabulary_bytes(path: str | Path) -> bytes:
    """Return the bytes of the vocabulary file at ``path``, at most :data:`MAX_VOCABULARY_BYTES` of them.

    Raises
    ------
    OSError
        If it cannot be read.
    ValueError
        If it is larger (a regular file is refused unread; a device such as
        ``/dev/zero``, which never ends, is read no further than the bound).
    """
    with Path(path).open("rb") as f:
        if os.fstat(f.fileno()).st_size > MAX_VOCABULARY_BYTES:
            raise ValueError(f"larger than {MAX_VOCABULARY_BYTES >> 20} MiB (not a vocabulary file?)")
        data = f.read(MAX_VOCABULARY_BYTES + 1)
    if len(data) > MAX_VOCABULARY_BYTES:
        raise ValueError(f"larger than {MAX_VOCABULARY_BYTES >> 20} MiB (not a vocabulary file?)")
    return data


@dataclass(frozen=True)
class Vocabulary:
    """Document frequencies of terms (SEMANTICS section 3.2).

    ``n_documents`` is ``N``; ``df`` maps a normalized term to its document
    frequency. A term missing from ``df`` has ``df = 1``. Range routing uses
    it to pick each clause's least frequent keyword. An empty vocabulary
    (no file) ranks terms by a deterministic fallback: longer terms first, then
    lexicographic (longer terms are rarer in natural text). ``digest`` is
    the SHA-256 of the file's bytes, hex (empty for no file): what a
    deployment records so that every process, and a resumed run, uses the
    same content (:func:`load_vocabulary`).
    """

    n_documents: int = 0
    df: dict[str, int] = field(default_factory=dict)
    digest: str = ""

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        """Read ``{"N": n, "df": {term: df}}`` from a JSON file.

        Terms must already be normalized (as :func:`normalize_term` does) and
        ``df`` values integers; terms with ``df = 1`` may be left out.

        Raises
        ------
        ConfigError
            If the file is missing, larger than :data:`MAX_VOCABULARY_BYTES`
            (read no further: a device such as ``/dev/zero`` never ends) or not
            of that shape.
        """
        try:
            data = _vocabulary_bytes(path)
            raw = json.loads(data.decode("utf-8"))
            n = raw["N"]
            if type(n) is not int or not 1 <= n < 2**53:
                raise TypeError(f"'N' must be an integer from 1 to 2**53 - 1, got {n!r}")
            df = raw["df"]
            if not isinstance(df, dict) or not all(type(v) is int and v >= 1 for v in df.values()):
                raise TypeError("'df' must be an object {term: df} with integer df >= 1")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"vocabulary file {path}: {exc}") from exc
        return cls(n, df, hashlib.sha256(data).hexdigest())

    def frequency(self, term: str) -> int:
        """Document frequency of ``term`` (1 when unknown)."""
        return self.df.get(term, 1)

    def idf(self, term: str) -> float:
        """``ln(N / df(term))`` (SEMANTICS section 3.2); 1 for every term when there is no vocabulary (N = 0)."""
        return math.log(self.n_documents / self.df.get(term, 1)) if self.n_documents else 1.0

    def least_frequent(self, terms: Iterable[str]) -> str:
        """Return the least frequent term (ties: longest, then lexicographically first).

        Raises
        ------
        ValueError
            If ``terms`` is empty.
        """
        df = self.df
        return min(terms, key=lambda t: (df.get(t, 1), -len(t), t))

    def summary_keywords(self, dnf: DNF) -> frozenset[str]:
        """One keyword per DNF clause, its least frequent (Tornado section 3.1)."""
        if len(dnf) == 1 and len(dnf[0]) == 1:
            return dnf[0]
        return frozenset(self.least_frequent(clause) for clause in dnf)


def hashed_evaluator(term: str, ring: Sequence[int]) -> int:
    """Return ``ring[crc32(term's UTF-8) % len(ring)]``: a term's evaluator among ``ring``'s slots, in any process.

    grid^t's term tables send a term no partitioning assigned by it
    (:class:`skpub.router.gridt.TermTable`), and an evaluator that splits a
    rectangle by text finds with it what it hands over (PS2Stream V-A phase
    I). CRC-32, unlike ``hash``, is the same in every process; O(len(term)).
    """
    return ring[zlib.crc32(term.encode("utf-8", "surrogatepass")) % len(ring)]


@lru_cache(maxsize=4)
def load_vocabulary(path: str | None, digest: str | None = None) -> Vocabulary:
    """Return the vocabulary at ``path`` (the empty one for None), cached per process.

    Executors call this once per worker process, not once per micro-batch.
    ``digest`` is the content's SHA-256 (hex) the deployment recorded
    (``Deployment.vocabulary_digest``; None: not checked): a file that
    differs between hosts, or was edited since the run began, would make
    routers and evaluators disagree on each clause's least frequent keyword.

    Raises
    ------
    ConfigError
        If the file is missing or not a vocabulary, or its content is not
        the one ``digest`` names.
    """
    vocabulary = Vocabulary.load(path) if path else Vocabulary()
    if digest is not None and vocabulary.digest != digest:
        raise ConfigError(mismatch_text(path, vocabulary.digest, digest))
    return vocabulary


def mismatch_text(path: str | None, digest: str, recorded: str) -> str:
    """Return the refusal of a vocabulary file whose content's SHA-256 ``digest`` is not the ``recorded`` one."""
    return (
        f"vocabulary file {path} is not the one this deployment recorded: its content's SHA-256 is "
        f"{digest[:16]}..., the recorded one {recorded[:16]}... (the file was edited since, or differs on this "
        "host); restore that file, or start a new run"
    )


def pin_vocabulary(deployment: Deployment) -> Deployment:
    """Return ``deployment`` with ``vocabulary_digest`` set to its vocabulary file's content's SHA-256.

    What a driver does before it records the deployment or ships it to its
    tasks, so that every process loading the file checks it has that
    content (:func:`load_vocabulary`, which also says whether it is a
    vocabulary). A deployment that carries a digest already (a recorded
    one, resumed) keeps it, and the file is checked against it. The file is
    read anew (not from the process's cache: it may have changed since) and
    hashed, not parsed; O(file size).

    Raises
    ------
    ConfigError
        If the file cannot be read, or is not the content the digest names.
    """
    if deployment.vocabulary is None:
        return deployment
    try:
        digest = hashlib.sha256(_vocabulary_bytes(deployment.vocabulary)).hexdigest()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"vocabulary file {deployment.vocabulary}: {exc}") from exc
    if deployment.vocabulary_digest not in (None, digest):
        raise ConfigError(mismatch_text(deployment.vocabulary, digest, deployment.vocabulary_digest))
    return dataclasses.replace(deployment, vocabulary_digest=digest)
