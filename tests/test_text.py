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
