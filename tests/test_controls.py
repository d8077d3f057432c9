"""Controls drawn several times: the two-level bootstrap over draws and samples (docs/methods.md#control-head-sets)."""

import numpy as np
import pandas as pd

from corelens.experiments.ablate import _summary
from corelens.experiments.evaluate import interval
from corelens.metrics.headsets import label
from corelens.metrics.uncertainty import draws_interval


def _draws(accuracies, n=40, seed=0):
    """Return (draws, n) answers: each draw answers right with its own probability, independently per sample."""
    rng = np.random.default_rng(seed)
    return (rng.random((len(accuracies), n)) < np.asarray(accuracies)[:, None]).astype(float)


def test_draws_that_disagree_widen_the_interval_where_pooling_does_not():
    differ = _draws([0.95, 0.2, 0.9, 0.1, 0.95])  # which heads were drawn decides the answers
    low, high = draws_interval(differ)
    pooled = interval(int(differ.sum()), differ.size)  # every answer counted as independent
    assert high - low > 2.5 * (pooled[1] - pooled[0])
    assert low < 0.4 and high > 0.75  # spans most of the draws' spread


def test_draws_that_agree_give_about_the_sampling_interval():
    agree = _draws([0.6] * 5)
    low, high = draws_interval(agree)
    assert low < agree.mean() < high and high - low < 0.4
    again = draws_interval(agree)
    assert (low, high) == again  # seeded: the same interval twice


def test_two_level_interval_covers_the_mean_over_all_draws():
    """The population: 200 possible head sets with accuracies spread 0.1-0.9; five are drawn, 40 questions."""
    rng = np.random.default_rng(3)
    population = rng.uniform(0.1, 0.9, 200)
    truth, covered, pooled_covered, reps = population.mean(), 0, 0, 300
    for rep in range(reps):
        drawn = rng.choice(population, 5, replace=False)
        answers = _draws(drawn, n=40, seed=rep + 100)
        low, high = draws_interval(answers, n_boot=400, seed=rep)
        covered += low <= truth <= high
        p_low, p_high = interval(int(answers.sum()), answers.size)
        pooled_covered += p_low <= truth <= p_high
    # A bootstrap over five draws is somewhat narrow (its percentile interval from 5 values); the pooled
    # interval ignores the draws altogether.
    assert covered / reps >= 0.85
    assert pooled_covered / reps < 0.7


def test_summary_uses_the_two_level_interval_for_drawn_sets_only():
    answers = _draws([0.9, 0.1, 0.8], n=30)
    rows, recs, names = [], [], {}
    for seed, row in enumerate(answers):
        name = f"random/3/s{seed}"
        names[("random", "3", seed)] = name
        rows.append({"set": "random", "k": "3", "k_heads": 3, "short_by": 0, "seed": seed,
                     "accuracy": row.mean(), "n": len(row), "correct": int(row.sum())})  # fmt: skip
        recs += [{"condition": name, "sample": f"q{i}", "correct": bool(v)} for i, v in enumerate(row)]
    rows.append({"set": "top", "k": "3", "k_heads": 3, "short_by": 0, "seed": pd.NA, "accuracy": 0.5, "n": 30,
                 "correct": 15})  # fmt: skip
    table = pd.DataFrame(rows)
    table["seed"] = table["seed"].astype("Int64")
    summary = _summary(table, pd.DataFrame(recs), names).set_index("set")
    low, high = draws_interval(answers)
    assert summary.loc["random", "interval"] == "two-level bootstrap"
    assert (summary.loc["random", "ci_low"], summary.loc["random", "ci_high"]) == (low, high)
    assert summary.loc["top", "interval"] == "wilson"
    assert (summary.loc["top", "ci_low"], summary.loc["top", "ci_high"]) == interval(15, 30)


def test_label_names_the_heads():
    assert label([(2, 0), (0, 7), (0, 3)]) == "L0H3 L0H7 L2H0"
