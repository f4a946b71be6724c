import pytest
from hypothesis import given
from hypothesis import strategies as st

from skpub.kernel.errors import ExpressionError
from skpub.kernel.text import Vocabulary, dnf_matches, normalize_term, normalize_terms, parse_expression, tokenize


def clauses(*sets):
    return tuple(frozenset(s) for s in sets)


def test_normalization_is_nfkc_casefold_nfkc():
    assert normalize_term("Straße") == "strasse"
    assert normalize_term("ﬁsh") == "fish"
    assert normalize_term("ＣＡＦÉ") == "café"
    assert tokenize("Great SUSHI-bar, café!") == ["great", "sushi", "bar", "café"]
    assert normalize_terms(["New York", "", "A"]) == ["new york", "a"]


@given(st.text(max_size=12))
def test_ascii_fast_path_equals_full_normalization(term):
    import unicodedata

    full = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", term).casefold())
    assert normalize_terms([term]) == ([full] if full else [])


_UNICODE_TERMS = st.lists(
    st.one_of(
        st.text(max_size=8),
        st.text(alphabet="a\u0301\u0300e\u00e9\u0130\u0131\u00dfK\u212a\ufb01\u1e9e\u0345\u03a3\u0000", max_size=6),
        # Hangul jamo compose (L V T), a combining mark or a jamo may start a term: never across the separator
        st.text(alphabet="\u1100\u1161\u11a8\uac00\u0301\u0345\u0308\u00a8\u3131", max_size=5),
    ),
    max_size=12,
)


@given(_UNICODE_TERMS)
def test_list_fast_paths_equal_term_by_term_normalization(terms):
    import unicodedata

    def full(term):
        return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", term).casefold())

    assert normalize_terms(terms) == [full(t) for t in terms if full(t)]


def test_and_binds_tighter_than_or():
    assert set(parse_expression("a OR b AND c")) == set(clauses({"a"}, {"b", "c"}))
    assert set(parse_expression("(a or b) and C")) == set(clauses({"a", "c"}, {"b", "c"}))


def test_absorption_and_duplicates_are_removed():
    assert parse_expression("a OR a AND b OR a") == clauses({"a"})


@pytest.mark.parametrize("expr", ["a b", "a AND", "OR a", "(a OR b", "a)", "()", "a AND () "])
def test_bad_expressions_raise(expr):
    with pytest.raises(ExpressionError):
        parse_expression(expr)


def test_dnf_blowup_is_refused():
    expr = " AND ".join(f"(a{i} OR b{i})" for i in range(10))
    with pytest.raises(ExpressionError, match="more than"):
        parse_expression(expr)


@given(st.lists(st.sampled_from("abcd"), min_size=1, max_size=4), st.sets(st.sampled_from("abcd")))
def test_keyword_conjunction_matches_iff_subset(words, terms):
    dnf = parse_expression(" AND ".join(words))
    assert dnf_matches(dnf, frozenset(terms)) == set(words).issubset(terms)


def test_least_frequent_uses_df_then_length_then_order():
    vocab = Vocabulary(100, {"common": 50, "rare": 2})
    assert vocab.least_frequent(["common", "rare"]) == "rare"
    assert vocab.least_frequent(["common", "unknownlong", "unk"]) == "unknownlong"
    assert vocab.summary_keywords(clauses({"common", "rare"}, {"common"})) == {"rare", "common"}


def test_expansion_is_bounded_in_terms_too():
    """256 clauses of 64 terms expand; one more term per clause is bad_expr, decided before expanding."""
    import tracemalloc

    from skpub.kernel.errors import ExpressionError
    from skpub.kernel.text import MAX_DNF_TERMS, parse_expression

    alternatives = "(" + " OR ".join(f"t{i}" for i in range(256)) + ")"
    fits = alternatives + " AND " + " AND ".join(f"x{i}" for i in range(63))
    dnf = parse_expression(fits)
    assert len(dnf) == 256 and sum(len(c) for c in dnf) == MAX_DNF_TERMS
    tracemalloc.start()
    with pytest.raises(ExpressionError, match="terms"):
        parse_expression(alternatives + " AND " + " AND ".join(f"x{i}" for i in range(30_000)))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 << 20


def _full(term):
    import unicodedata

    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", term).casefold())


# characters where normalization has context or changes length: combining marks (composing or not), Hangul jamo L, V,
# T and syllables LV, LVT, Indic vowel signs that compose as starters, kana voicing marks, sigma forms, ß/ẞ, dotted
# I, Kelvin and Angstrom signs, ligatures, fullwidth, Roman numerals, Tibetan U+0F73, iota subscript, NUL
_EDGES = (
    "aeAEoOiIuUsSkK\u00c5\u00e5\u00e9\u00c9\u0301\u0300\u0308\u0323\u0345\u0327\u1100\u1112\u1161\u1175\u11a8"
    "\u11c2\uac00\uac01\ud7a3\u0b47\u0b3e\u0b57\u0bc6\u0bbe\u0bd7\u0dd9\u0dcf\u1025\u102e\u304b\u3099\u309a\u30ab"
    "\u03a3\u03c3\u03c2\u00df\u1e9e\u0130\u0131\u212a\u212b\ufb01\ufb00\uff21\uff41\u2160\u0f73\u0f71\u0f72\u1fb3"
    "\u1f00\u0391\u0410\u0430\u0419\u0439\u0418\u0306\u00a8\u3131\u0000\u00b5\u017f\u0149\u01c4\u01c5\u01c6"
    "\u0359\u0334\u0e48\u0e38"  # combining marks that canonical reordering swaps (classes 220 and 1; 107 and 103)
)


def test_plain_characters_keep_terms_exact_one_by_one_and_exclude_what_composes():
    """Every code point alone, normalized in Arrow where plain, is SEMANTICS 2's normalization; and none of the
    characters that compose with the one before them, or fold to two, or that NFKC changes, is plain."""
    from skpub.kernel.text import normalize_array, plain_characters

    every = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    assert normalize_array(every).to_pylist() == [_full(c) for c in every]
    plain = plain_characters()
    assert len(plain) > 40_000 and "\u00e9" in plain and "\uac00" in plain and "\u03a3" in plain
    for ch in "\u0301\u1161\u11a8\u0bbe\u3099\u00df\u1e9e\u0130\u212a\ufb01\uff21\u2160\u0f73\u0345\u01c5":
        assert ch not in plain, hex(ord(ch))


def test_plain_fast_path_equals_the_full_normalization_on_every_pair_and_triple_of_edge_characters():
    from itertools import product

    from skpub.kernel.text import normalize_array

    terms = ["".join(t) for t in product(_EDGES, repeat=2)] + ["".join(t) for t in product(_EDGES[::3], repeat=3)]
    assert normalize_array(terms).to_pylist() == [_full(t) for t in terms]


@given(st.lists(st.text(alphabet=_EDGES + "\u4e1c\u4eac\u0416\u00fc\u00f1", min_size=1, max_size=10), max_size=30))
def test_plain_fast_path_equals_the_full_normalization_on_edge_texts(terms):
    from skpub.kernel.text import normalize_array

    assert normalize_array(terms).to_pylist() == [_full(t) for t in terms]


def test_without_plain_characters_every_non_ascii_term_takes_the_exact_path(monkeypatch):
    """Should Arrow lower with context (or fold differently everywhere), nothing is plain and the result holds."""
    from skpub.kernel import text

    monkeypatch.setattr(text, "_not_plain_pattern", lambda: None)
    terms = ["Zürich", "ΟΔΟΣ", "\u1100\u1161", "abc", "straße", "東京", "İ"]
    assert text.normalize_array(terms).to_pylist() == [_full(t) for t in terms]


def test_every_canonical_pair_lies_below_the_planes_the_followers_scan():
    """The composition followers are found by scanning planes 0 and 1: no canonical pair may lie beyond them."""
    import unicodedata

    from skpub.kernel.text import PAIRED_PLANES_END

    beyond = []
    for code in range(PAIRED_PLANES_END, 0x110000):
        mapping = unicodedata.decomposition(chr(code))
        if mapping and not mapping.startswith("<") and len(mapping.split()) == 2:
            beyond.append(hex(code))
    assert beyond == []
