"""Answer scoring: whether a response answers the gold, and the interval of a share of right answers.

Scorers: `exact` (normalised exact match), `choice` (multiple-choice letter, or the choice's text),
`yesno`; `auto` picks `yesno` for yes/no golds, `choice` when the gold is a letter naming one of the
choices, `exact` otherwise.

`choice` reads a letter only from an explicit answer: the letter alone ("B", "b", "B."), or a marked letter
at the start ("(B)", "B.", "B)", "B:", each optionally followed by the choice's text), after an optional
answer phrase ("Answer: B", "the answer is (B)", "The best option is B."). A response that starts with a
bare letter and a word ("a red circle", "I think B") names no letter; it is right only when, without the
answer phrase, it is the gold choice's text. A response that names a letter is judged by that letter alone,
so a choice whose text is itself a letter cannot be confused with a letter answer.

Examples:
    >>> score("The answer is (B).", "B", ["red", "blue"]), score("a red circle", "A", ["a red circle", "x"])
    (True, True)
    >>> [round(x, 3) for x in interval(8, 10)]
    [0.49, 0.943]
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

from scipy.stats import binomtest

from corelens.choices import SCORERS
from corelens.errors import OptionError

__all__ = ["SCORERS", "choice_letter", "interval", "normalise", "score"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_LETTERS = string.ascii_uppercase


def normalise(text: str) -> str:
    """Return `text` lower-cased, without punctuation, articles or extra whitespace."""
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return " ".join(_ARTICLES.sub(" ", text).split())


# The answer phrases follow lmms-eval's multiple-choice parsers (`extract_characters_regex` in
# lmms_eval/tasks/videomme/utils.py: "The best answer is", "The correct answer is", "The answer is",
# "The best option is", "Best answer:", "Answer:", ...; "(A)" in `parse_multi_choice_response`,
# lmms_eval/tasks/mmmu/utils.py). Unlike those parsers, which take the first capital letter anywhere,
# a letter counts only at the start of what follows the phrase.
_PHRASE = re.compile(r"^(?:the\s+)?(?:(?:best|correct|final)\s+)?(?:answer|option)(?:\s+is)?\s*:?\s*", re.I)
_ALONE = re.compile(r"^([A-Za-z])$")
_MARKED = re.compile(r"^(?:\(([A-Za-z])\)|([A-Za-z])[.):])(?:\s|$)")


def _answer_part(text: str) -> str:
    """Return `text` without surrounding space and a leading answer phrase ("Answer:", "The answer is")."""
    return _PHRASE.sub("", text.strip(), count=1)


def choice_letter(text: str) -> str | None:
    """Return the upper-case letter an explicit multiple-choice answer names, or None.

    Examples:
        >>> [choice_letter(t) for t in ("B", "(b)", "B) red", "The answer is C.", "a red circle", "I think B")]
        ['B', 'B', 'B', 'C', None, None]
    """
    part = _answer_part(text).rstrip(".! ")  # a closing full stop belongs to the sentence
    match = _ALONE.match(part) or _MARKED.match(part)
    if match is None:
        return None
    return next(g for g in match.groups() if g).upper()


def score(prediction: str, gold: str, choices: Sequence[str] | None = None, scorer: str = "auto") -> bool:
    """Return whether `prediction` answers `gold` under `scorer`."""
    if scorer == "auto":
        if normalise(gold) in ("yes", "no"):
            scorer = "yesno"
        elif choices and len(gold.strip()) == 1 and gold.strip().upper() in _LETTERS[: len(choices)]:
            scorer = "choice"
        else:
            scorer = "exact"
    if scorer == "exact":
        return normalise(prediction) == normalise(gold)
    if scorer == "yesno":
        words = normalise(prediction).split()
        return bool(words) and words[0] == normalise(gold)
    if scorer == "choice":
        want = gold.strip().upper()
        letter = choice_letter(prediction)
        if letter is not None:  # an explicit letter answer is judged by its letter only
            return letter == want
        index = _LETTERS.find(want)
        if not choices or not 0 <= index < len(choices):
            return False
        # Otherwise the response must be the gold choice's text (with or without an answer phrase).
        return normalise(choices[index]) in (normalise(prediction), normalise(_answer_part(prediction)))
    raise OptionError(f"unknown scorer {scorer!r}; expected one of {SCORERS}")


def interval(correct: int, n: int) -> tuple[float, float]:
    """Return the 95 % Wilson interval of a proportion (nan, nan when n = 0)."""
    if n == 0:
        return float("nan"), float("nan")
    ci = binomtest(correct, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)
