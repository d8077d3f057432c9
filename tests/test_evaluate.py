"""Scorers and the greedy evaluation harness."""

from __future__ import annotations

import pytest

from corelens.metrics.answers import interval, normalise, score

ABCD = ["cat", "dog", "red circle", "blue square"]
LETTERS = ["B", "A", "C"]  # choices that are themselves letters: choice A's text is "B"


@pytest.mark.parametrize(
    ("prediction", "gold", "choices", "scorer", "expected"),
    [
        # the three cases of issue 17: a bare letter followed by words names no letter
        ("a red circle", "A", ABCD, "auto", False),
        ("A dog", "A", ["cat", "dog"], "auto", False),
        ("I think B", "I", list("abcdefghij"), "auto", False),
        # the letter alone, in either case, with a full stop
        ("B", "B", ABCD, "auto", True),
        ("b", "B", ABCD, "auto", True),
        ("B.", "B", ABCD, "auto", True),
        (" C ", "C", ABCD, "auto", True),
        ("A", "B", ABCD, "auto", False),
        # explicit marked forms, with or without the choice's text after them
        ("(B)", "B", ABCD, "auto", True),
        ("(b)", "B", ABCD, "auto", True),
        ("B)", "B", ABCD, "auto", True),
        ("B) dog", "B", ABCD, "auto", True),
        ("B. dog", "B", ABCD, "auto", True),
        ("(C) red circle", "C", ABCD, "auto", True),
        ("D: blue square", "D", ABCD, "auto", True),
        ("(A) cat", "B", ABCD, "auto", False),
        # answer phrases (lmms-eval's)
        ("Answer: B", "B", ABCD, "auto", True),
        ("answer: b", "B", ABCD, "auto", True),
        ("The answer is B", "B", ABCD, "auto", True),
        ("the answer is (D).", "D", ABCD, "auto", True),
        ("The best answer is C.", "C", ABCD, "auto", True),
        ("The correct option is A", "A", ABCD, "auto", True),
        ("The answer is C", "B", ABCD, "auto", False),
        # articles and pronouns at the start are words, not letters
        ("A cat", "B", ABCD, "auto", False),
        ("A cat", "A", ABCD, "auto", True),  # the text of choice A, with an article
        ("a dog", "B", ABCD, "auto", True),
        ("I don't know", "I", list("abcdefghij"), "auto", False),
        ("I", "I", list("abcdefghij"), "auto", True),
        # the choice's text instead of its letter
        ("dog", "B", ABCD, "auto", True),
        ("Dog.", "B", ABCD, "auto", True),
        ("a red circle", "C", ABCD, "auto", True),
        ("The answer is blue square", "D", ABCD, "auto", True),
        ("cat", "B", ABCD, "auto", False),
        ("red", "C", ABCD, "auto", False),
        # choices that are themselves single letters: a letter answer is judged as a letter
        ("A", "A", LETTERS, "auto", True),
        ("B", "A", LETTERS, "auto", False),
        ("(B)", "B", LETTERS, "auto", True),
        # other scorers
        ("The Red.", "red", None, "auto", True),
        ("red cup", "red", None, "auto", False),
        ("Yes, it is.", "yes", None, "auto", True),
        ("no", "yes", None, "auto", False),
        ("", "yes", None, "yesno", False),
        ("b", "B", ["x", "y"], "choice", True),
        ("B", "b", None, "exact", True),
    ],
)
def test_scorers(prediction, gold, choices, scorer, expected):
    assert score(prediction, gold, choices, scorer) is expected


def test_normalise_and_interval():
    assert normalise("  An  Apple, please! ") == "apple please"
    low, high = interval(45, 100)
    assert low < 0.45 < high and high - low == pytest.approx(0.19, abs=0.01)
    with pytest.raises(ValueError, match="unknown scorer"):
        score("a", "a", None, "fuzzy")


def test_evaluate_scores_the_organism(tmp_path):
    from dataclasses import replace

    import corelens
    from corelens.data import read_samples
    from corelens.experiments.evaluate import evaluate
    from corelens.organism import CHECKPOINT
    from corelens.organism.tasks import generate

    m = corelens.load(CHECKPOINT)
    samples, _ = read_samples(generate("image", tmp_path, 6, seed=0))
    result = evaluate(m, samples, max_new_tokens=3)
    assert list(result.records.columns) == ["id", "task", "prediction", "gold", "correct"]
    assert result.records["gold"].tolist() == [s.answer for s in samples]
    # The organism reads every image right (exact scorer); without the image it guesses one in six.
    assert result.records["correct"].tolist() == [True] * 6 and result.accuracy == 1.0
    assert result.records["prediction"].tolist() == result.records["gold"].tolist()
    blank = evaluate(m, samples, max_new_tokens=3, blank=True)
    assert blank.records["correct"].tolist() == [False, False, False, True, False, False]
    # The same answers against letter golds: the choice scorer matches the choice's text.
    lettered = [replace(s, answer="ABCDE"[s.choices.index(s.answer)]) for s in samples]
    again = evaluate(m, lettered, max_new_tokens=3, blank=True)
    assert again.records["correct"].tolist() == blank.records["correct"].tolist()
