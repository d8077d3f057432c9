"""Scorers and the greedy evaluation harness."""

from __future__ import annotations

import pytest

from corelens.experiments.evaluate import interval, normalise, score


@pytest.mark.parametrize(
    ("prediction", "gold", "choices", "scorer", "expected"),
    [
        ("The Red.", "red", None, "auto", True),
        ("red cup", "red", None, "auto", False),
        ("B) red", "B", ["blue", "red"], "auto", True),
        ("red", "B", ["blue", "red"], "auto", True),
        ("A", "B", ["blue", "red"], "auto", False),
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


def test_evaluate_records_answers(tiny_dir, tmp_path):
    import corelens
    from corelens.data import read_samples
    from corelens.experiments.evaluate import evaluate
    from corelens.organism.tasks import generate

    m = corelens.load(tiny_dir("qwen2_vl"))
    samples, _ = read_samples(generate("image", tmp_path, 2, seed=0))
    result = evaluate(m, samples, max_new_tokens=3)
    assert list(result.records.columns) == ["id", "task", "prediction", "gold", "correct"]
    assert result.n == 2 and result.records["gold"].tolist() == [s.answer for s in samples]
    blank = evaluate(m, samples, max_new_tokens=3, blank=True)
    assert blank.n == 2
