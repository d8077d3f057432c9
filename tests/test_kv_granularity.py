"""Head sets at KV-head granularity: KV scores, counts, effective shares, and exports read as the peers read them.

The peers' loaders are written out below from their sources (read for these tests):
- DuoAttention, mit-han-lab/duo-attention `duo_attn/utils.py` at 03dca842639c64ed0d0daf9042da845cdea44637:
  `load_attn_pattern` (np.loadtxt of full_attention_heads.tsv, clipped to [0, 1]; sink_size / recent_size
  from config.json) and `sparsify_attention_heads` (adds uniform noise in [0, 1e-6), thresholds at the
  `sparsity` quantile of all values, full = value >= threshold; sparsity >= 1: none full, <= 0: all full);
- kvpress, NVIDIA/kvpress `kvpress/presses/duo_attention_press.py` at 00a150c3f3bb90313eafe2f61f9790ff232168e4:
  `DuoAttentionPress.__post_init_from_model__` streams the round(size x head_compression_ratio) KV heads with
  the lowest values (np.argsort over the flattened (layers, KV heads) matrix);
- SparseMM, gdace829/SparseMM `sparsemm/sparsemm_utils.py` at 89221e60d9f97b2ebc1521935e86ae5e447a9da1:
  `SparseMM.__init__` takes `np.mean` of each "L-H" entry of the head-score JSON in file order, divides by
  their sum, views them as (layers, heads / groups, groups) and sums the last axis: one score per KV head.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from corelens.cli import main
from corelens.errors import OptionError
from corelens.heads import HeadSet
from corelens.heads.formats import DUO_CONFIG, DUO_TSV, SPARSEMM_SCORES, write_duo, write_sparsemm
from corelens.metrics import kvheads
from corelens.organism.tasks import WORDS, generate

LAYERS, HEADS, KV = 2, 4, 2  # the tiny GQA checkpoint: 4 query heads over 2 KV heads per layer
GROUP = HEADS // KV


# --- the peers' loaders, reimplemented (see the module docstring) ----------------------------------------


def duo_load(folder):
    """DuoAttention's `load_attn_pattern`: (values, sink, recent)."""
    values = np.clip(np.loadtxt(folder / DUO_TSV, dtype=float, delimiter="\t", ndmin=2), 0, 1)
    config = json.loads((folder / DUO_CONFIG).read_text())
    return values, config["sink_size"], config["recent_size"]


def duo_sparsify(values, sparsity, seed=0):
    """DuoAttention's `sparsify_attention_heads(values, sparsity=...)`: the full KV heads (booleans)."""
    values = values + np.random.default_rng(seed).uniform(0, 1e-6, values.shape)
    threshold = np.quantile(values, sparsity)
    threshold = 2 if sparsity >= 1 else -1 if sparsity <= 0 else threshold
    return values >= threshold


def kvpress_full(values, ratio):
    """kvpress DuoAttentionPress: the KV heads that are not streamed (booleans)."""
    n_pruned = round(values.size * ratio)
    streaming = np.zeros(values.shape, dtype=bool)
    if n_pruned > 0:
        streaming[np.unravel_index(np.argsort(values, axis=None)[:n_pruned], values.shape)] = True
    return ~streaming


def sparsemm_kv_scores(path, layers, heads, kv):
    """SparseMM's per-KV-head scores from a head-score JSON (normalised to sum 1)."""
    data = json.loads(path.read_text())
    scores = np.array([np.mean(v) for v in data.values()])
    scores = scores / scores.sum()
    return scores.reshape(layers, kv, heads // kv).sum(-1)


# --- fixtures ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ranked(tmp_path_factory):
    """A tiny GQA checkpoint ranked once per query head, then re-tabulated per KV head (sum and max)."""
    from corelens.models.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("kv")
    model = build_tiny_checkpoint(
        "qwen2_5_vl", root / "model", words=WORDS, layers=LAYERS, heads=HEADS, kv_heads=KV
    )
    data = generate("image", root / "data", 6, seed=3)
    base = ["rank", "--model", str(model), "--data", str(data), "--n-boot", "200", "--overlays", "0"]
    runs = {}
    for name, extra in {
        "query": [],
        "kv": ["--granularity", "kv"],
        "max": ["--granularity", "kv", "--kv-rule", "max"],
    }.items():
        runs[name] = root / name
        assert main([*base, "--out", str(runs[name]), "--k", "1,50%", *extra]) == 0
    return {"model": model, "data": data, **runs}


def _query_table(layers=3, heads=8, kv=2, seed=0):
    rng = np.random.default_rng(seed)
    rows = [
        {"layer": lyr, "head": hd, "mass": rng.random(), "n": 5}
        for lyr in range(layers)
        for hd in range(heads)
    ]
    table = pd.DataFrame(rows).sort_values("mass", ascending=False)
    table["rank"] = np.arange(1, len(table) + 1)
    return table.reset_index(drop=True)


def _model(layers, heads, kv):
    return {"layers": layers, "heads": heads, "kv_heads": kv, "config_hash": "abc"}


# --- scores and counts ------------------------------------------------------------------------------------


def test_kv_scores_are_the_sum_of_their_query_heads(ranked):
    query = pd.read_csv(ranked["query"] / "heads.csv")
    kv = pd.read_csv(ranked["kv"] / "heads.csv")
    # Independently: each KV head's mass is the sum of its query heads' mean masses in the query table.
    expected = query.assign(kv=query["head"] // GROUP).groupby(["layer", "kv"])["mass"].sum()
    assert len(kv) == LAYERS * KV and (kv["granularity"] == "kv").all()
    for row in kv.itertuples():
        assert row.mass == pytest.approx(expected[(row.layer, row.head)], abs=1e-12)
        assert row.query_heads == " ".join(str(row.head * GROUP + i) for i in range(GROUP))
    # Ranked by that mass, best first, 1..L x KV.
    assert kv["mass"].is_monotonic_decreasing and list(kv["rank"]) == list(range(1, LAYERS * KV + 1))
    # --k counts KV heads: 50 % of 4 KV heads is 2 (of 8 query heads, 4); P(top-k) sums to k.
    assert sorted(c for c in kv.columns if c.startswith("p_top")) == ["p_top1", "p_top2"]
    assert kv["p_top1"].sum() == pytest.approx(1) and kv["p_top2"].sum() == pytest.approx(2)
    manifest = json.loads((ranked["kv"] / "manifest.json").read_text())
    assert manifest["granularity"] == {
        "granularity": "kv", "kv_rule": "sum", "query_heads_per_kv_head": GROUP, "ranked_heads": LAYERS * KV
    }  # fmt: skip
    # ram.parquet stays per query head.
    assert len(pd.read_parquet(ranked["kv"] / "ram.parquet")) == 6 * LAYERS * HEADS


def test_kv_rule_max_is_the_best_member_per_sample(ranked):
    ram = pd.read_parquet(ranked["query"] / "ram.parquet")
    best = ram.assign(kv=ram["head"] // GROUP).groupby(["sample_id", "layer", "kv"])["mass"].max()
    expected = best.groupby(["layer", "kv"]).mean()
    kv = pd.read_csv(ranked["max"] / "heads.csv")
    for row in kv.itertuples():
        assert row.mass == pytest.approx(expected[(row.layer, row.head)], abs=1e-12)
    with pytest.raises(OptionError, match="--kv-rule"):
        kvheads.kv_frame(ram, GROUP, "median")


def test_kv_table_of_a_query_table_equals_the_kv_ranking(ranked):
    query = pd.read_csv(ranked["query"] / "heads.csv")
    kv = pd.read_csv(ranked["kv"] / "heads.csv")
    converted = kvheads.kv_table(query, GROUP)
    assert (
        converted[["layer", "head", "rank"]].values.tolist() == kv[["layer", "head", "rank"]].values.tolist()
    )
    assert converted["mass"].to_numpy() == pytest.approx(kv["mass"].to_numpy(), abs=1e-12)


# --- effective shares -------------------------------------------------------------------------------------


def test_effective_shares_of_a_query_set_with_partly_full_kv_heads():
    # KV head (0, 0) has both members full, (1, 1) one of two: both stay full; (0, 1) and (1, 0) stream.
    full = [(0, 0), (0, 1), (1, 2)]
    got = kvheads.shares(full, LAYERS, HEADS, KV, sink=2, window=8, tokens=[100, 20])
    assert got["query_full"] == 3 and got["query_fraction"] == 3 / 8
    assert got["kv_full"] == 2 and got["kv_fraction"] == 0.5 and got["query_full_by_kv"] == 4
    # Bytes: a full KV head keeps N positions, a streaming one S + W = 10.
    at = [(2 * n + 2 * min(n, 10)) / (4 * n) for n in (100, 20)]
    assert got["cache_kept_fraction"] == pytest.approx(np.mean(at), abs=1e-15)
    # A short prompt (N <= S + W) trims nothing; no length: the long-prompt limit.
    assert kvheads.shares(full, LAYERS, HEADS, KV, sink=2, window=8, tokens=10)["cache_kept_fraction"] == 1
    assert kvheads.shares(full, LAYERS, HEADS, KV)["cache_kept_fraction"] == 0.5


def test_a_random_tenth_of_query_heads_holds_most_kv_heads_on_a_7b_shape():
    # Qwen2.5-VL-7B: 28 layers x 28 query heads over 4 KV heads (groups of 7).
    rng = np.random.default_rng(0)
    total = 28 * 28
    picks = rng.choice(total, size=round(0.1 * total), replace=False)
    full = [divmod(int(i), 28) for i in picks]
    got = kvheads.shares(full, 28, 28, 4)
    groups = {(layer, head // 7) for layer, head in full}
    assert got["kv_full"] == len(groups) and got["kv_fraction"] == len(groups) / 112
    assert got["kv_fraction"] > 0.4  # asked 10 %, the cache keeps about half


def test_headset_effective_of_query_and_kv_sets():
    table = _query_table()
    hs = HeadSet(_model(3, 8, 2), table)
    asked = hs.top(3)
    e = hs.effective(3)
    groups = {(layer, head // 4) for layer, head in asked}
    assert e["granularity"] == "query" and e["asked"] == 3 and e["asked_fraction"] == 3 / 24
    assert e["query_full"] == 3 and e["kv_full"] == len(groups) and e["kv_fraction"] == len(groups) / 6
    assert e["duo_sparsity"] == pytest.approx(1 - len(groups) / 6)
    kv = HeadSet(_model(3, 8, 2), kvheads.kv_table(table, 4))
    e = kv.effective(2)
    assert e["granularity"] == "kv" and e["asked"] == 2 and e["asked_fraction"] == 2 / 6
    assert e["query_full"] == 8 and e["kv_full"] == 2 and e["duo_sparsity"] == pytest.approx(4 / 6)
    assert kv.query_top(2) == list(kvheads.expand(kv.top(2), 4))


# --- exports, read back as the peers read them -------------------------------------------------------------


@pytest.mark.parametrize("keep", [1, 2, 3, 5])
def test_duo_export_of_a_query_set_reproduces_its_kv_heads(tmp_path, keep):
    hs = HeadSet(_model(3, 8, 2), _query_table(seed=keep))
    folder = write_duo(hs, tmp_path / "duo", keep, sink=4, window=16)
    values, sink, recent = duo_load(folder)
    assert (sink, recent) == (4, 16)
    effective = json.loads((folder / DUO_CONFIG).read_text())["corelens"]["effective"]
    expected = np.zeros((3, 2), dtype=bool)
    for layer, head in hs.top(keep):
        expected[layer, head // 4] = True
    assert effective["kv_full"] == expected.sum() and effective["asked"] == keep
    for seed in range(5):  # DuoAttention's tie-breaking noise never changes the set
        assert (duo_sparsify(values, effective["duo_sparsity"], seed) == expected).all()
    assert (kvpress_full(values, effective["kvpress_head_compression_ratio"]) == expected).all()


@pytest.mark.parametrize("keep", [1, 3, 6])
def test_duo_export_of_a_kv_set_keeps_exactly_its_kv_heads(tmp_path, keep):
    kv = HeadSet(_model(3, 8, 2), kvheads.kv_table(_query_table(seed=keep), 4))
    folder = write_duo(kv, tmp_path / "duo", keep)
    values, _, _ = duo_load(folder)
    effective = json.loads((folder / DUO_CONFIG).read_text())["corelens"]["effective"]
    expected = np.zeros((3, 2), dtype=bool)
    for layer, head in kv.top(keep):
        expected[layer, head] = True
    assert effective["kv_full"] == keep and effective["asked"] == keep
    assert (duo_sparsify(values, effective["duo_sparsity"]) == expected).all()
    assert (kvpress_full(values, effective["kvpress_head_compression_ratio"]) == expected).all()


def test_sparsemm_reads_the_kv_scores_of_both_granularities(tmp_path):
    table = _query_table()
    query_set = HeadSet(_model(3, 8, 2), table)
    kv_set = HeadSet(_model(3, 8, 2), kvheads.kv_table(table, 4))
    expected = np.zeros((3, 2))
    for row in table.itertuples():
        expected[row.layer, row.head // 4] += row.mass
    total = expected.sum()
    expected /= total
    for name, hs in (("query", query_set), ("kv", kv_set)):
        chosen, scores = write_sparsemm(hs, tmp_path / name, 2)
        assert scores.name == SPARSEMM_SCORES
        assert sparsemm_kv_scores(scores, 3, 8, 2) == pytest.approx(expected, abs=1e-12)
        # Before SparseMM's normalisation, too: its members' scores add up to each KV head's mass.
        raw = np.array([np.mean(v) for v in json.loads(scores.read_text()).values()]).reshape(3, 2, 4).sum(-1)
        assert raw == pytest.approx(expected * total, abs=1e-12)
    # The set of a KV export lists every query head of its KV heads.
    plain = json.loads((tmp_path / "kv" / "sparsemm_heads.json").read_text())
    listed = sorted((int(layer), h) for layer, hs in plain.items() for h in hs)
    assert listed == list(kvheads.expand(kv_set.top(2), 4))


def test_export_command_prints_and_stores_the_effective_shares(ranked, tmp_path, capsys):
    out = tmp_path / "export"
    assert (
        main(["export", str(ranked["query"]), "--out", str(out), "--keep", "3", "--to", "duo,sparsemm"]) == 0
    )
    printed = capsys.readouterr().out
    query = pd.read_csv(ranked["query"] / "heads.csv")
    groups = {(int(r.layer), int(r.head) // GROUP) for r in query.head(3).itertuples()}
    sparsity = 1 - len(groups) / (LAYERS * KV)
    assert "asked 3 query heads (37.5%)" in printed and f"{len(groups)} KV heads full" in printed
    assert f"--sparsity {sparsity:.6f}" in printed
    stored = json.loads((out / "headset.json").read_text())["provenance"]["effective"]
    assert f"{stored['kv_full']} of the KV heads full" in (out / "README.md").read_text()
    assert stored["kv_full"] == len(groups) and stored["duo_sparsity"] == pytest.approx(sparsity)
    values, _, _ = duo_load(out / "duo_attention")
    assert duo_sparsify(values, stored["duo_sparsity"]).sum() == len(groups)
    # A KV-granular run: --keep counts KV heads, and the artifact loads back as KV heads.
    out = tmp_path / "kv_export"
    assert main(["export", str(ranked["kv"]), "--out", str(out), "--keep", "1", "--to", "duo"]) == 0
    assert "top 1 of 4 KV heads" in capsys.readouterr().out
    assert "every decoder attention KV head" in (out / "README.md").read_text()
    back = HeadSet.load(out)
    assert back.granularity == "kv" and len(back.heads) == LAYERS * KV and len(back.query_top()) == GROUP
    values, _, _ = duo_load(out / "duo_attention")
    assert duo_sparsify(values, 0.75).sum() == 1


# --- hybrid and ablate --------------------------------------------------------------------------------------


def test_hybrid_conditions_expand_kv_heads_to_their_query_heads():
    from corelens.experiments.hybrid import conditions

    kv = kvheads.kv_table(_query_table(layers=2, heads=4, kv=2), 2)
    conds = conditions(kv, ["50%"], ["top", "bottom"], 1, 0, 2, 8, group=2)
    top = conds[1]
    assert top.asked == 2 and top.policy.full == kvheads.expand(
        kv.head(2)[["layer", "head"]].values.tolist(), 2
    )
    assert len(top.policy.full) == 4 and top.policy.source["granularity"] == "kv"


def test_policy_from_a_kv_table_keeps_whole_kv_heads(ranked):
    from corelens.attention.streaming import HybridPlan

    kv = pd.read_csv(ranked["kv"] / "heads.csv")
    policy = HybridPlan.from_heads(kv, 2, sink=2, window=4)
    assert policy.full == kvheads.expand(zip(kv["layer"][:2], kv["head"][:2]), GROUP)
    assert policy.source["granularity"] == "kv"
    assert (
        not policy.streaming_kv(LAYERS, HEADS, KV)
        .view(-1)[[2 * lyr + h for lyr, h in zip(kv["layer"][:2], kv["head"][:2])]]
        .any()
    )


def test_hybrid_command_states_asked_and_effective_shares(ranked, tmp_path):
    data = generate("image", tmp_path / "data", 2, seed=11)
    out = tmp_path / "hybrid"
    base = ["hybrid", "--model", str(ranked["model"]), "--data", str(data), "--sink", "2", "--window", "4",
            "--max-new-tokens", "1", "--sets", "top", "--keep", "25%"]  # fmt: skip
    query_heads = ranked["query"] / "heads.csv"
    assert main([*base, "--heads", str(query_heads), "--out", str(out), "--granularity", "kv"]) == 0
    table = pd.read_csv(out / "hybrid.csv")
    tokens = pd.read_parquet(out / "records.parquet").drop_duplicates("sample")["tokens"].tolist()
    top = table[table["set"] == "top"].iloc[0]
    # 25 % of 4 KV heads = 1 KV head = its 2 query heads.
    assert top["granularity"] == "kv" and top["asked"] == 1 and top["asked_fraction"] == 0.25
    assert top["full_heads"] == GROUP and top["kv_full_heads"] == 1 and top["kv_fraction"] == 0.25
    kept = np.mean([(n + 3 * min(n, 6)) / (4 * n) for n in tokens])
    assert top["cache_kept_fraction"] == pytest.approx(kept, abs=1e-12)
    dense = table[table["set"] == "dense"].iloc[0]
    assert dense["kv_fraction"] == 1 and dense["cache_kept_fraction"] == 1 and dense["asked_fraction"] == 1
    assert json.loads((out / "manifest.json").read_text())["settings"]["granularity"] == "kv"
    # Query granularity on the same table: 25 % of 8 query heads = 2, in 1 or 2 KV heads.
    out_q = tmp_path / "hybrid_q"
    assert main([*base, "--heads", str(query_heads), "--out", str(out_q)]) == 0
    top = pd.read_csv(out_q / "hybrid.csv").query("set == 'top'").iloc[0]
    query = pd.read_csv(query_heads)
    groups = {(int(r.layer), int(r.head) // GROUP) for r in query.head(2).itertuples()}
    assert top["granularity"] == "query" and top["asked"] == 2 and top["full_heads"] == 2
    assert top["kv_full_heads"] == len(groups)


def test_read_heads_converts_or_refuses(ranked, tmp_path, capsys):
    from corelens.experiments.ablate import read_heads
    from corelens.models.loaded import load

    m = load(ranked["model"], device="cpu")
    kv_path, query_path = ranked["kv"] / "heads.csv", ranked["query"] / "heads.csv"
    assert kvheads.granularity_of(read_heads(kv_path, m)) == "kv"
    assert kvheads.granularity_of(read_heads(query_path, m, "kv")) == "kv"
    assert kvheads.granularity_of(read_heads(query_path, m)) == "query"
    with pytest.raises(OptionError, match="cannot be split"):
        read_heads(kv_path, m, "query")
    data = generate("image", tmp_path / "data", 1, seed=5)
    argv = ["hybrid", "--model", str(ranked["model"]), "--data", str(data), "--heads", str(kv_path),
            "--out", str(tmp_path / "x"), "--granularity", "query"]  # fmt: skip
    assert main(argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("corelens: error: --granularity query:") and "cannot be split" in last


def test_ablate_counts_kv_heads_and_ablates_their_query_heads(ranked, tmp_path):
    data = generate("image", tmp_path / "data", 1, seed=5)
    out = tmp_path / "ablate"
    argv = ["ablate", "--model", str(ranked["model"]), "--data", str(data), "--heads",
            str(ranked["kv"] / "heads.csv"), "--out", str(out), "--k", "1", "--sets", "top,random",
            "--seeds", "1", "--max-new-tokens", "1"]  # fmt: skip
    assert main(argv) == 0
    table = pd.read_csv(out / "ablation.csv")
    sets = table[table["set"] != "none"]
    assert (sets["granularity"] == "kv").all() and (sets["k_heads"] == 1).all()
    assert (sets["query_heads"] == GROUP).all() and (sets["kv_heads"] == 1).all()
    policies = json.loads((out / "headsets.json").read_text())
    top = next(p for p in policies if p["name"].startswith("top"))
    best = pd.read_csv(ranked["kv"] / "heads.csv").iloc[0]
    assert sorted(map(tuple, top["heads"])) == list(kvheads.expand([(best["layer"], best["head"])], GROUP))


def test_bench_hybrid_draws_whole_kv_heads():
    from corelens.bench import hybrid_kernels as bench

    assert bench.choose_full(8, 0.5, 3) == bench.choose_full(8, 0.5, 3, group=1)  # query draws unchanged
    for seed in range(5):
        chosen = bench.choose_full(16, 0.25, seed, group=4)
        assert len(chosen) == 4 and len({i // 4 for i in chosen}) == 1  # one whole KV head
    got = bench.kernel_times(64, [0.5], heads=4, kv_heads=2, head_dim=8, sink=2, window=8, repeats=1,
                             seed=0, with_flex=False, granularity="kv")  # fmt: skip
    row = got["per_keep"]["0.5"]
    assert row["full_fraction"] == 0.5 and row["kv_full_fraction"] == 0.5
    assert len({h // 2 for h in got["kernel_full_heads"]["0.5"]}) == 1
    with pytest.raises(OptionError, match="--granularity"):
        bench.choose_full(8, 0.5, 0, group=bench._group("layer", 8, 2))


def test_core_press_states_the_effective_shares_of_a_query_set():
    pytest.importorskip("kvpress")
    from corelens.integrations.kvpress import CorePress

    hs = HeadSet(_model(3, 8, 2), _query_table(seed=4))
    press = CorePress(heads=hs, keep=3, sink=4, window=16)
    sink, window, values = press.load_attention_pattern(None)
    groups = {(layer, head // 4) for layer, head in hs.top(3)}
    assert press.effective["asked"] == 3 and press.effective["kv_full"] == len(groups)
    assert press.head_compression_ratio == pytest.approx(press.effective["kvpress_head_compression_ratio"])
    assert kvpress_full(values, press.head_compression_ratio).sum() == len(groups)
