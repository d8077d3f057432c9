"""Controls drawn several times: the two-level bootstrap over draws and samples (docs/methods.md#control-head-sets)."""

import json

import numpy as np
import pandas as pd
import pytest

from corelens.experiments.ablate import _summary
from corelens.metrics.answers import interval
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


def test_two_draws_that_agree_get_no_narrower_interval_than_one_draw():
    """Two draws both right on all 16 questions: the bootstrap over them has width 0 (issue 44); the interval
    shown is at least each draw's own Wilson interval."""
    names = {("random", "3", 0): "r0", ("random", "3", 1): "r1"}
    rows = [{"set": "random", "k": "3", "k_heads": 3, "short_by": 0, "seed": s, "accuracy": 1.0, "n": 16,
             "correct": 16} for s in (0, 1)]  # fmt: skip
    recs = [{"condition": c, "sample": f"q{i}", "correct": True} for c in ("r0", "r1") for i in range(16)]
    table = pd.DataFrame(rows)
    table["seed"] = table["seed"].astype("Int64")
    row = _summary(table, pd.DataFrame(recs), names).iloc[0]
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(interval(16, 16))
    assert row["ci_high"] - row["ci_low"] > 0.15 and row["interval"] == "widest of draws (few draws)"


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


# --- seeding by (run seed, task, k, draw) and --seeds auto -------------------------------------------------

TABLE = pd.DataFrame({"layer": np.repeat(range(4), 8), "head": list(range(8)) * 4, "rank": range(1, 33)})


def test_draws_differ_across_tasks_and_run_seeds_and_repeat_for_the_same_ones():
    from corelens.metrics.headsets import head_sets, select, task_seed

    def sets(task, seed):
        return [
            hs.heads
            for hs in head_sets(TABLE, ["2", "3"], ["random", "layer-matched"], 6, base_seed=seed, task=task)
        ]

    assert sets("image", 0) == sets("image", 0)  # the same (seed, task, k, draw): the same sets
    assert sets("image", 0) != sets("video", 0) and sets("image", 0) != sets("image", 1)
    # each draw differs, not just the list as a whole: few (k, draw) pairs share their set across tasks
    same = sum(a == b for a, b in zip(sets("image", 0), sets("document", 0)))
    assert same < len(sets("image", 0)) / 2
    assert task_seed("image") == int.from_bytes(__import__("hashlib").sha256(b"image").digest()[:8], "big")
    assert select(TABLE, "random", 3, 4, task="video") == select(TABLE, "random", 3, 4, task="video")


def test_task_of_names_the_samples_task_or_the_file():
    from corelens.data.sample import DEFAULT_TASK, Sample, task_of

    def s(task):
        return Sample(id=task, task=task, question="q")

    assert task_of([s("video"), s("video")], "x/eval.jsonl") == "video"
    assert task_of([s("video"), s("image")], "x/mixed.jsonl") == "mixed"  # several tasks: the file
    assert task_of([s(DEFAULT_TASK)], "x/charts.jsonl") == "charts"  # none given: the file


CRITICAL = {(0, 0): 0.0, (0, 1): 0.0}  # heads whose loss costs every answer; the other six cost none


@pytest.fixture(scope="module")
def fake_setup(tmp_path_factory):
    """A tiny model, a head table of its 8 heads and 8 image + 8 video samples; answers are faked below."""
    from corelens.cli import main
    from corelens.models.tiny import build_tiny_checkpoint
    from corelens.organism.tasks import WORDS, generate

    root = tmp_path_factory.mktemp("controls")
    model = build_tiny_checkpoint("qwen2_5_vl", root / "model", words=WORDS, layers=2, heads=4, kv_heads=2)
    ident = generate("image", root / "ident", 2, seed=1)
    assert main(["rank", "--model", str(model), "--data", str(ident), "--out", str(root / "rank"),
                 "--overlays", "0"]) == 0  # fmt: skip
    data = {t: generate(t, root / "eval", 8, seed=3) for t in ("image", "video")}
    return model, root / "rank" / "heads.csv", data


@pytest.fixture
def fake_answers(monkeypatch):
    """Answer right unless the ablated set holds a CRITICAL head: a draw's accuracy is 1, or 0 (known spread)."""

    import corelens.experiments.policy_sweep as experiment  # the sweeps answer through its `answer`

    state = {"heads": (), "calls": 0}

    def fake_answer(m, prepared, policy, *, sample, **kw):
        state["heads"] = policy.heads
        state["calls"] += 1
        return "wrong" if any(h in CRITICAL for h in state["heads"]) else sample.answer

    monkeypatch.setattr(experiment, "answer", fake_answer)
    return state


def _t_width(values):
    from scipy import stats

    values = np.asarray(values, dtype=float)
    return 2 * stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))


def test_auto_draws_stop_at_the_target_width_and_report_the_real_width(
    fake_setup, fake_answers, tmp_path, capsys
):
    import corelens
    from corelens.experiments.ablate import sweep

    model, heads, data = fake_setup
    m = corelens.load(model, device="cpu")
    # k = 2 of 8 heads: a draw holds a critical head with P = 13/28; draw accuracies are 0 or 1, sd ~0.5, so
    # a width of 0.6 needs about (2 * 2.1 * 0.5 / 0.6)^2 ~ 12-25 draws: more than the first 10.
    common = dict(ks=["2"], sets=("top", "random"), max_new_tokens=2, warn=lambda _: None, max_draws=40)
    got = sweep(m, data["image"], heads, **common, control_width=0.6, out=tmp_path / "w")
    row = got.summary.set_index("set").loc["random"]
    accuracies = got.table.loc[got.table["set"] == "random", "accuracy"].to_numpy()
    assert set(np.unique(accuracies)) == {0.0, 1.0}
    n = len(accuracies)
    assert row["seeds"] == n > 10 and (n - 10) % 5 == 0 and row["stopped"] == "width"
    assert got.table.loc[got.table["set"] == "random", "seed"].tolist() == list(range(n))  # draws 0..n-1
    assert row["draw_width"] == pytest.approx(_t_width(accuracies), abs=1e-12) and row["draw_width"] <= 0.6
    assert _t_width(accuracies[:-5]) > 0.6  # it stopped at the first batch that met the target
    manifest = json.loads((tmp_path / "w" / "manifest.json").read_text())
    entry = manifest["controls"]["sets"][0]
    assert manifest["controls"]["task"] == manifest["settings"]["task"] == "image"
    assert (entry["draws"], entry["stopped"]) == (n, "width") and entry["draw_width"] == row["draw_width"]
    assert f"random k=2: {n} draws" in capsys.readouterr().err

    capped = sweep(m, data["image"], heads, **{**common, "max_draws": 15}, control_width=0.05, out=None)
    row = capped.summary.set_index("set").loc["random"]
    assert (row["seeds"], row["stopped"]) == (15, "cap") and row["draw_width"] > 0.05
    assert "stopped by --max-draws 15 before --control-width 0.05" in capsys.readouterr().err


def test_auto_draws_resume_with_the_same_sets(fake_setup, fake_answers, tmp_path):
    import corelens
    from corelens.experiments.ablate import sweep

    model, heads, data = fake_setup
    m = corelens.load(model, device="cpu")
    common = dict(ks=["2"], sets=("random",), max_new_tokens=2, warn=lambda _: None, control_width=0.6)
    out = tmp_path / "run"
    first = sweep(m, data["image"], heads, **common, out=out)
    sets = (out / "headsets.json").read_text()
    log = out / "samples.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[: 8 * 12]) + "\n")  # killed in the second round (draws 10-14)
    fake_answers["calls"] = 0
    again = sweep(m, data["image"], heads, **common, out=out)
    assert 0 < fake_answers["calls"] < len(lines)
    pd.testing.assert_frame_equal(first.table, again.table)
    assert (out / "headsets.json").read_text() == sets
    fake_answers["calls"] = 0
    sweep(m, data["image"], heads, **common, out=out)  # finished: nothing to answer again
    assert fake_answers["calls"] == 0


def test_a_sweep_draws_other_sets_for_another_task_and_seed(fake_setup, fake_answers):
    import corelens
    from corelens.experiments.ablate import sweep

    model, heads, data = fake_setup
    m = corelens.load(model, device="cpu")
    common = dict(ks=["3"], sets=("random",), seeds=4, max_new_tokens=2, warn=lambda _: None)

    def drawn(task, seed=0):
        table = sweep(m, data[task], heads, **common, seed=seed).table
        return table.loc[table["set"] == "random", "heads"].tolist()

    assert drawn("image") == drawn("image") != drawn("video") and drawn("image") != drawn("image", seed=1)
    summary = sweep(m, data["video"], heads, **common).summary
    assert (summary["task"] == "video").all() and (
        summary.loc[summary["set"] == "random", "stopped"] == "fixed"
    ).all()


def test_hybrid_auto_draws_keep_their_summary(fake_setup, tmp_path, monkeypatch, capsys):
    """The hybrid curve draws in batches too: answered right unless a CRITICAL head streams (is not kept full)."""
    import types

    import corelens
    import corelens.experiments.hybrid as experiment
    import corelens.experiments.policy_sweep as policy_sweep

    def fake_prepare(m, sample):
        return types.SimpleNamespace(seq_len=10, sample=sample)

    def fake_answer(m, p, policy, *a, **kw):
        lost = policy is not None and not all(h in policy.full for h in CRITICAL)
        return "wrong" if lost else p.sample.answer

    # The sweeps prepare and answer through the policy sweep's module.
    monkeypatch.setattr(policy_sweep, "prepare", fake_prepare)
    monkeypatch.setattr(policy_sweep, "answer", fake_answer)
    model, heads, data = fake_setup
    m = corelens.load(model, device="cpu")
    # 4 of 8 heads kept: both critical heads with P = 6/28, so draw accuracies are 0 or 1 and differ
    got = experiment.curve(
        m, data["video"], heads, keeps=["4"], sets=("top", "random"), control_width=0.5, sink=2, window=4,
        max_new_tokens=2, warn=lambda _: None, out=tmp_path / "h",
    )  # fmt: skip
    accuracies = got.table.loc[got.table["set"] == "random", "accuracy"].to_numpy()
    row = pd.read_csv(tmp_path / "h" / "hybrid_summary.csv").set_index("set").loc["random"]
    assert row["seeds"] == len(accuracies) >= 10 and row["task"] == "video"
    assert row["draw_width"] == pytest.approx(_t_width(accuracies)) and row["stopped"] in ("width", "cap")
    assert (row["stopped"] == "width") == (row["draw_width"] <= 0.5)
    policies = json.loads((tmp_path / "h" / "policies.json").read_text())
    assert sum(p["name"].startswith("random/") for p in policies) == len(accuracies)
    assert f"video: random k=4: {len(accuracies)} draws" in capsys.readouterr().err
