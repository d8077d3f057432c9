"""`corelens frontier`: its cells are `hybrid` / `ablate` on the same set, its table, figure and 95 % budgets."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from corelens.experiments.frontier import budget_interval, methods_of, smallest_budget


def _heads(folder, order, scorer=None):
    """Write a heads.csv ranking the organism's 4 x 8 heads in `order` (best first); a manifest naming `scorer`."""
    folder.mkdir(parents=True)
    rank = {head: i + 1 for i, head in enumerate(order)}
    rows = [(layer, head, rank[(layer, head)]) for layer, head in ALL]
    pd.DataFrame(rows, columns=["layer", "head", "rank"]).assign(mass=0.0).to_csv(
        folder / "heads.csv", index=False
    )
    if scorer:
        (folder / "manifest.json").write_text(json.dumps({"command": "rank", "settings": {"scorer": scorer}}))
    return folder / "heads.csv"


ALL = [(layer, head) for layer in range(4) for head in range(8)]


@pytest.mark.e2e
def test_frontier_cells_are_hybrid_and_ablate_on_the_same_set(tmp_path):
    from corelens.cli import main
    from corelens.organism import organism_path
    from corelens.organism.tasks import generate

    model = organism_path()  # trained: the accuracies differ between sets
    data = generate("document", tmp_path / "data", n=6, seed=7)
    order = [(0, 3), (0, 4), *[p for p in ALL if p not in ((0, 3), (0, 4))]]
    a = _heads(tmp_path / "rank-a", order, scorer="ram")
    b = _heads(tmp_path / "rank-b", order[::-1])
    out = tmp_path / "frontier"
    common = ["--model", str(model), "--data", str(data), "--max-new-tokens", "2"]
    argv = ["frontier", *common, "--heads", str(a), f"reversed={b}", "--out", str(out), "--budgets", "2,8",
            "--sink", "4", "--window", "16", "--draws", "1"]  # fmt: skip
    assert main(argv) == 0
    table = pd.read_csv(out / "frontier.csv")
    assert sorted(set(table["method"])) == ["ram", "random", "reversed"]
    assert not [c for c in table if c.startswith("graded")]  # without --graded: the table as before
    assert (out / "figures" / "frontier.png").stat().st_size > 0
    assert set(pd.read_csv(out / "frontier_budgets.csv")["method"]) == {"ram", "random", "reversed"}
    agree = pd.read_csv(out / "rankings.csv")
    assert agree["spearman"].tolist() == pytest.approx([-1.0, -1.0]) and agree["overlap"].tolist() == [
        0.0,
        0.0,
    ]

    from corelens.report.summary import frontier_sentences

    said = frontier_sentences(out, json.loads((out / "manifest.json").read_text()))
    assert len(said) == 4 and all(
        line.startswith(("ram keeps", "random keeps", "reversed keeps")) for line in said[:3]
    )
    assert said[0].startswith("ram keeps ≥ 95 % of dense accuracy") and "from 8 full heads" in said[0]
    assert said[3].startswith("Least KV cache kept at ≥ 95 % of dense accuracy: ram (query heads)")

    # The same set through `corelens hybrid` and `corelens ablate`: the same accuracies, cell by cell.
    hyb, abl = tmp_path / "hybrid", tmp_path / "ablate"
    assert main(["hybrid", *common, "--heads", str(b), "--out", str(hyb), "--keep", "2,8", "--sets", "top",
                 "--sink", "4", "--window", "16"]) == 0  # fmt: skip
    assert main(["ablate", *common, "--heads", str(b), "--out", str(abl), "--k", "2,8", "--sets", "top"]) == 0
    h = pd.read_csv(hyb / "hybrid.csv")
    ab = pd.read_csv(abl / "ablation.csv")
    mine = table[table["method"] == "reversed"].astype({"budget": str}).set_index("budget")
    for keep in ("2", "8"):
        got = h[(h["set"] == "top") & (h["keep"].astype(str) == keep)]["accuracy"].item()
        assert mine.loc[keep, "hybrid_accuracy"] == got
        got = ab[(ab["set"] == "top") & (ab["k"].astype(str) == keep)]["accuracy"].item()
        assert mine.loc[keep, "ablate_accuracy"] == got
    assert table["hybrid_accuracy"].nunique() > 1 and table["ablate_accuracy"].nunique() > 1  # cells differ
    assert (mine["dense_accuracy"] == h[h["set"] == "dense"]["accuracy"].item()).all()

    logged = (out / "methods" / "ram" / "own" / "hybrid" / "samples.jsonl").read_text()
    assert main(argv) == 0  # resumed: nothing answered twice
    assert (out / "methods" / "ram" / "own" / "hybrid" / "samples.jsonl").read_text() == logged


def test_smallest_budget_on_a_hand_made_table():
    t = pd.DataFrame(
        {
            "method": ["a"] * 3 + ["b"] * 3,
            "granularity": "query",
            "budget": ["8", "2", "4"] * 2,  # out of order: sorted by the cache kept
            "full_heads": [8, 2, 4] * 2,
            "cache_kept_fraction": [0.8, 0.2, 0.4] * 2,
            "dense_accuracy": 0.8,
            "hybrid_accuracy": [0.79, 0.5, 0.76, 0.5, 0.6, 0.7],  # a: 0.76 = 95 % of 0.8 at 4; b: never
        }
    )
    found = smallest_budget(t).set_index("method")
    assert found.loc["a", "budget"] == "4" and found.loc["a", "cache_kept_fraction"] == 0.4
    assert not found.loc["b", "reached"] and pd.isna(found.loc["b", "full_heads"])
    # Every sample right under dense and at the 2nd budget, wrong at the 1st: the interval is the 2nd's point.
    answers = pd.DataFrame({"dense": [1, 1, 1, 1], "top/2": [0, 0, 0, 0], "top/4": [1, 1, 1, 1]})
    assert budget_interval(answers, ["top/2", "top/4"], [0.2, 0.4]) == (0.4, 0.4)
    never = pd.DataFrame({"dense": [1, 1], "top/2": [0, 0]})
    low, high = budget_interval(never, ["top/2"], [0.2])
    assert pd.isna(low) and pd.isna(high)


def test_a_bad_heads_file_is_one_line(tmp_path, capsys):
    from corelens.cli import main
    from corelens.organism import organism_path
    from corelens.organism.tasks import generate

    data = generate("document", tmp_path / "data", n=1, seed=7)
    good = _heads(tmp_path / "good", ALL)
    bad = tmp_path / "bad" / "heads.csv"
    bad.parent.mkdir()
    bad.write_text("layer,head,rank\n0,0,1\n9,0,2\n")  # no layer 9
    argv = ["frontier", "--model", str(organism_path()), "--data", str(data), "--heads", str(good),
            str(bad), "--out", str(tmp_path / "out"), "--budgets", "2"]  # fmt: skip
    assert main(argv) != 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "error" in line]
    assert len(said) == 1 and str(bad) in said[0] and "Traceback" not in err
    assert not (tmp_path / "out" / "methods").exists()  # refused before the first answer
    assert [m.label for m in methods_of([f"x={good}", str(good)])] == ["x", "good"]


def test_methods_are_named_by_the_scorer_their_run_records(tmp_path):
    """Real rank runs (a dict `score` in the manifest, none for RAM) and their export (headset.json's
    provenance) name their method by the scorer."""
    import corelens
    from corelens.cli import main
    from corelens.organism import organism_path
    from corelens.organism.tasks import generate

    m = corelens.load(organism_path(), device="cpu")
    data = generate("document", tmp_path / "data", n=2, seed=7)
    corelens.rank(m, data, query="answer", k=None, out=tmp_path / "a")
    corelens.rank(m, data, score="outside-window", sink="4", window="16", k=None, out=tmp_path / "b")
    assert main(["export", str(tmp_path / "b"), "--out", str(tmp_path / "b-set")]) == 0
    methods = methods_of([str(tmp_path / "a" / "heads.csv"), str(tmp_path / "b"), str(tmp_path / "b-set")])
    assert [(x.label, x.scorer) for x in methods] == [
        ("ram", "ram"),
        ("outside-window", "outside-window"),
        ("outside-window-2", "outside-window"),
    ]


def test_the_report_counts_kv_budgets_in_kv_heads(tmp_path):
    """At KV granularity the finding names the KV heads kept full (and their query heads), not the query heads
    as if they were KV heads; a table of an older frontier (no kv_full_heads) says query heads."""
    from corelens.report.summary import frontier_sentences

    cells = pd.DataFrame(
        {
            "method": ["gates"] * 2,
            "granularity": "kv",
            "budget": ["1", "2"],
            "full_heads": [4, 8],
            "kv_full_heads": [1.0, 2.0],
            "cache_kept_fraction": [0.25, 0.4],
            "dense_accuracy": 1.0,
            "hybrid_accuracy": [0.5, 1.0],
            "hybrid_ci_low": [0.2, 0.8],
            "hybrid_ci_high": [0.8, 1.0],
            "ablate_accuracy": [0.5, 0.0],
        }
    )
    budgets = pd.DataFrame([{"method": "gates", "granularity": "kv", "budget": "2", "full_heads": 8.0,
                             "cache_kept_fraction": 0.4, "reached": True, "ci_low": 0.4, "ci_high": 0.4}])  # fmt: skip
    cells.to_csv(tmp_path / "frontier.csv", index=False)
    budgets.to_csv(tmp_path / "frontier_budgets.csv", index=False)
    said = frontier_sentences(tmp_path, {"settings": {"data": "x/document.jsonl"}})
    assert "from 2 full KV heads (8 query heads), 40 % of the KV cache" in said[0]
    cells.drop(columns="kv_full_heads").to_csv(tmp_path / "frontier.csv", index=False)
    assert "from 8 full query heads, 40 %" in frontier_sentences(tmp_path, {})[0]


def test_rankings_are_compared_at_each_granularity():
    """With --granularity query,kv the agreement is given in both units, the budgets counted in each."""
    from corelens.experiments.frontier import agreement

    def table(order, heads):
        return pd.DataFrame([(layer, head, i + 1) for i, (layer, head) in enumerate(order)],
                            columns=["layer", "head", "rank"]).assign(heads=heads)  # fmt: skip

    query = [(layer, head) for layer in range(4) for head in range(8)]
    kv = [(layer, head) for layer in range(4) for head in range(2)]
    tables = {("a", "query"): table(query, 8), ("b", "query"): table(query[::-1], 8),
              ("a", "kv"): table(kv, 2), ("b", "kv"): table(kv, 2)}  # fmt: skip
    got = agreement(tables, ["query", "kv"], ["2", "50%"])
    assert got[["granularity", "k"]].values.tolist() == [["query", 2], ["query", 16], ["kv", 2], ["kv", 4]]
    assert got["spearman"].tolist() == pytest.approx([-1, -1, 1, 1])
    assert got["overlap"].tolist() == [0.0, 0.0, 1.0, 1.0]


def _by_hand(m, samples, heads, budget, select):
    """Answer `samples` under `graded` built here from heads.csv's mass column (nothing of the frontier's)."""
    from corelens.experiments.evaluate import evaluate
    from corelens.policies import Policy

    rows = pd.read_csv(heads)
    scores = [[int(a), int(b), float(c)] for a, b, c in zip(rows["layer"], rows["head"], rows["mass"])]
    policy = Policy.from_dict(
        {"name": "graded", "scores": scores, "budget": budget, "select": select, "sink": 4}
    )
    return evaluate(m, samples, policy=policy, max_new_tokens=2).records.set_index("id")


def test_graded_cells_are_the_graded_policy_answered_by_hand(tmp_path):
    """Each graded cell answers as `evaluate` under the same `graded` policy built by hand; at budget 1 it
    keeps the whole cache and answers as the model itself (the dense baseline and `evaluate` without one)."""
    import corelens
    from corelens.data.sample import read_samples
    from corelens.experiments.evaluate import evaluate
    from corelens.experiments.graded_cells import graded_cells
    from corelens.organism import organism_path
    from corelens.organism.tasks import generate

    m = corelens.load(organism_path(), device="cpu")
    data = generate("document", tmp_path / "data", n=2, seed=7)
    heads = _heads(tmp_path / "rank", ALL)
    pd.read_csv(heads).assign(mass=[((7 * i) % 11) / 10 for i in range(32)]).to_csv(heads, index=False)
    out = tmp_path / "graded"
    budgets = {"2": 0.3, "all": 1.0}
    table = graded_cells(m, data, heads, budgets, ["sink+window", "top"], sink=4, max_new_tokens=2, out=out)
    records = pd.read_parquet(out / "records.parquet")
    samples, _ = read_samples(data)
    for select in ("sink+window", "top"):
        for keep, budget in budgets.items():
            got = records[records["condition"] == f"{select}/{keep}"].set_index("sample")["prediction"]
            assert got.to_dict() == _by_hand(m, samples, heads, budget, select)["prediction"].to_dict()
    cell = table.set_index(["set", "keep"])
    assert cell.loc[("top", "2"), "cache_kept_fraction"] == pytest.approx(0.3, abs=0.01)  # the budget kept
    assert cell.loc[("top", "all"), "cache_kept_fraction"] == 1.0
    dense = evaluate(m, samples, max_new_tokens=2).records.set_index("id")["prediction"].to_dict()
    assert records[records["condition"] == "dense"].set_index("sample")["prediction"].to_dict() == dense
    for select in ("sink+window", "top"):
        assert (
            records[records["condition"] == f"{select}/all"].set_index("sample")["prediction"].to_dict()
            == dense
        )


@pytest.mark.e2e
def test_frontier_graded_cells_match_their_binary_cells_kv_share(tmp_path):
    """--graded: each method's graded cell keeps the binary cell's share of the KV cache, answers as the policy
    built by hand at that budget, is drawn and said in the finding, and resumes without answering again."""
    import corelens
    from corelens.cli import main
    from corelens.data.sample import read_samples
    from corelens.organism import organism_path
    from corelens.organism.tasks import generate
    from corelens.report.summary import frontier_sentences

    data = generate("document", tmp_path / "data", n=3, seed=7)
    heads = _heads(tmp_path / "rank", [(0, 3), (0, 4), *[p for p in ALL if p not in ((0, 3), (0, 4))]], "ram")
    pd.read_csv(heads).assign(mass=[((7 * i) % 11) / 10 for i in range(32)]).to_csv(heads, index=False)
    out = tmp_path / "frontier"
    argv = ["frontier", "--model", str(organism_path()), "--data", str(data), "--heads", str(heads), "--out",
            str(out), "--budgets", "2,8", "--sink", "4", "--window", "16", "--draws", "1", "--max-new-tokens", "2",
            "--graded", "sink+window,top"]  # fmt: skip
    assert main(argv[:-2]) == 0  # first without: then resumed with --graded, only the graded cells answered
    hybrid_log = (out / "methods" / "ram" / "own" / "hybrid" / "samples.jsonl").read_text()
    assert main(argv) == 0
    assert (out / "methods" / "ram" / "own" / "hybrid" / "samples.jsonl").read_text() == hybrid_log
    table = pd.read_csv(out / "frontier.csv").astype({"budget": str})
    mine = table[table["method"] == "ram"].set_index("budget")
    assert table.loc[table["method"] == "random", "graded_top_accuracy"].isna().all()
    for stem in ("graded_sink_window", "graded_top"):
        assert (mine[f"{stem}_kept"] - mine["cache_kept_fraction"]).abs().max() < 0.01  # equal KV budget
        assert mine[f"{stem}_ci_low"].le(mine[f"{stem}_accuracy"]).all()
    graded = json.loads((out / "methods" / "ram" / "own" / "graded" / "manifest.json").read_text())
    assert graded["settings"]["budgets"] == mine["cache_kept_fraction"].to_dict()
    m = corelens.load(organism_path(), device="cpu")
    samples, _ = read_samples(data)
    for keep in ("2", "8"):
        by_hand = _by_hand(m, samples, heads, mine.loc[keep, "cache_kept_fraction"], "top")
        assert mine.loc[keep, "graded_top_accuracy"] == by_hand["correct"].mean()
    assert (out / "figures" / "frontier.png").stat().st_size > 0
    said = frontier_sentences(out, json.loads((out / "manifest.json").read_text()))
    assert [line.split(" beats")[0] for line in said[-2:]] == ["Graded sink+window", "Graded top"]
    logged = (out / "methods" / "ram" / "own" / "graded" / "samples.jsonl").read_text()
    assert main(argv) == 0  # resumed: nothing answered twice
    assert (out / "methods" / "ram" / "own" / "graded" / "samples.jsonl").read_text() == logged
