import pytest

from lit_ascent.action_words import UNPARSED, first_word, leading_words, top_word, unseen_share, word_shares


def test_first_word_and_shares_against_counts():
    assert first_word("craft 1 stick using 2 planks") == "craft" and first_word(None) == UNPARSED
    assert first_word("   ") == UNPARSED
    shares = word_shares([["get 1 a", "craft 1 b", None], ["get 2 c", "not enough d"]])
    assert list(shares) == ["get", "craft", UNPARSED, "not"]  # commonest first, ties in first-seen order
    assert shares["get"] == pytest.approx(2 / 5) and sum(shares.values()) == pytest.approx(1.0)
    assert word_shares([]) == {} and word_shares([[]]) == {}


def test_leading_and_top_words_skip_unparsed():
    shares = {UNPARSED: 0.5, "get": 0.3, "craft": 0.2}
    assert leading_words(shares, 2) == ["get", "craft"] and top_word(shares) == "get"
    assert top_word({UNPARSED: 1.0}) is None and top_word({}) is None


def test_unseen_share_counts_parsed_words_the_reference_lacks():
    reference = {"craft": 0.5, "get": 0.45, UNPARSED: 0.05}
    collapsed = {"get": 0.5, "not": 0.3, "craft": 0.1, "use": 0.05, UNPARSED: 0.05}
    assert unseen_share(collapsed, reference) == pytest.approx(0.35)  # not + use; unparsed is never a word
    assert unseen_share(reference, reference) == 0.0 and unseen_share({}, reference) == 0.0
