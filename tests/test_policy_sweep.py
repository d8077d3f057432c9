"""The policy sweep as data: a `Preset` of a template, a few values and callables runs a whole sweep.

A toy sweep (zero ablation, its own outputs and sets file) built with the required fields only, plus a
per-record field placed before the prediction: the driver draws the head sets, answers each distinct policy
once per sample, records, writes the sets file and the manifest's policy, and concludes with the tables.
Answers are faked (the head sets, not the model, are under test here).
"""

import json
from dataclasses import dataclass, replace

import pandas as pd
import pytest

from corelens.errors import OptionError
from corelens.experiments.policy_sweep import Preset, Tables, parameters, records_frame, sweep_policies
from corelens.experiments.sweep import condition_table
from corelens.metrics.headsets import head_sets
from corelens.policies import ZeroHeads
from corelens.runs.context import RunContext
from corelens.runs.outputs import Outputs

TOY = Outputs(
    "toy",
    {
        "records": "records.parquet",
        "table": "toy.csv",
        "summary": "toy_summary.csv",
        "resampled": "resampled.csv",
    },
    {"toy": "figures/toy.png"},
    {"sets": "sets.json"},
    summary="table",
)


@dataclass(frozen=True)
class Cond:
    name: str
    kind: str
    k: str
    seed: int | None
    policy: ZeroHeads

    @property
    def heads(self):
        return self.policy.heads


def toy_preset(template: ZeroHeads, **more) -> Preset:
    """Zero ablation of each head set, the baseline an empty set; a table of accuracy per condition."""

    def conditions(plan, ks, kinds, which, resampled=()):
        sets = head_sets(plan.table, ks, kinds, which, base_seed=plan.seed, task=plan.task)
        base = Cond("none", "none", "0", None, template)
        return [base, *(Cond(s.name, s.kind, s.k, s.seed, replace(template, heads=s.heads)) for s in [*sets, *resampled])]  # fmt: skip

    def tables(plan, ok, conds):
        records = records_frame(ok)

        def row(c, got, scores):
            return {"set": c.kind, "k": c.k, "k_heads": len(c.heads), "seed": c.seed, **scores, "short_by": 0}

        columns = ["set", "k", "k_heads", "seed", "accuracy", "n", "correct", "ci_low", "ci_high", "short_by"]
        return Tables(records, condition_table(records, conds, row, columns), {"toy": len(conds)})

    def figure(plan, tables, paths):
        paths["toy"].write_text(f"{len(tables.table)} rows")

    return Preset("toy", TOY, "k", "k_heads", template, ("heads", "label", "seed", "meta"), conditions,
                  entry=lambda plan, c: {"name": c.name, "heads": [list(h) for h in c.heads]},
                  tables=tables, figure=figure, **more)  # fmt: skip


@pytest.fixture(scope="module")
def toy_setup(tiny_dir, tmp_path_factory):
    """A tiny model (4 query heads over 2 KV heads per layer), its rank run's heads.csv, 3 samples."""
    from corelens.cli import main
    from corelens.organism.tasks import generate

    model, root = tiny_dir("qwen2_5_vl", kv_heads=2), tmp_path_factory.mktemp("toy")
    ident = generate("image", root / "ident", 2, seed=1)
    rank = root / "rank"
    assert (
        main(["rank", "--model", str(model), "--data", str(ident), "--out", str(rank), "--overlays", "0"])
        == 0
    )
    return model, rank / "heads.csv", generate("image", root / "eval", 3, seed=3)


def test_a_sweep_is_a_template_and_a_few_callables(toy_setup, tmp_path, monkeypatch):
    import corelens
    import corelens.experiments.policy_sweep as policy_sweep

    model, heads, data = toy_setup
    calls = []

    def fake_answer(m, prepared, policy, *, sample, stats, **kw):
        calls.append((sample.id, policy.heads))
        stats["measured"] = len(policy.heads)
        return sample.answer if (0, 0) not in policy.heads else "wrong"

    monkeypatch.setattr(policy_sweep, "answer", fake_answer)
    m = corelens.load(model, device="cpu")
    preset = toy_preset(
        ZeroHeads(),
        record=lambda prepared, stats: {"tokens": prepared.seq_len, "measured": stats["measured"]},
        before=("tokens",),
    )
    common = dict(sets=["top", "random"], seeds=2, seed=0, random_from="all", stable_p=0.9, control_width=0.1,
                  max_draws=40, rank_resamples=1, resample=False, scorer="auto", max_new_tokens=2)  # fmt: skip
    out = tmp_path / "toy"
    ctx = RunContext(out=out, progress=False)
    swept = sweep_policies(
        preset, m, data, heads, ks=["2"], granularity=None, warn=lambda _: None, ctx=ctx, **common
    )

    names = ["none", "top/2", "random/2/s0", "random/2/s1", "top-resampled/2/s0"]
    assert swept.table["set"].tolist() == [n.split("/")[0] for n in names] and swept.manifest == {"toy": 5}
    sets = json.loads((out / "sets.json").read_text())
    assert [s["name"] for s in sets] == names
    # The resampled set on all samples (resample=False) is the top set: one generation answers both.
    assert sets[1]["heads"] == sets[4]["heads"]
    distinct = {json.dumps(s["heads"]) for s in sets}
    assert len(calls) == 3 * len(distinct) < 3 * len(names)
    logged = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    ok = [r for r in logged if r.get("status") == "ok"]
    assert len(ok) == 3 * len(names)
    fields = list(ok[0])
    assert (
        fields.index("task") < fields.index("tokens") < fields.index("prediction") < fields.index("measured")
    )
    assert all(r["measured"] == len(s["heads"]) for r in ok for s in sets if s["name"] == r["condition"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["policy"] == parameters(ZeroHeads(), preset.filled) == {"name": "zero"}
    assert manifest["toy"] == 5 and (out / "figures" / "toy.png").read_text() == "5 rows"
    assert pd.read_csv(out / "toy.csv")["n"].tolist() == [3] * 5
    assert list(pd.read_parquet(out / "records.parquet").columns) == policy_sweep.RECORD


def test_a_presets_check_refuses_before_the_run_is_opened(toy_setup, tmp_path):
    import corelens

    model, heads, data = toy_setup

    def check(plan):
        raise OptionError(f"--k {plan.ks[0]}: refused")

    m = corelens.load(model, device="cpu")
    common = dict(sets=["top"], seeds=1, seed=0, random_from="all", stable_p=0.9, control_width=0.1,
                  max_draws=40, rank_resamples=0, resample=True, scorer="auto", max_new_tokens=2)  # fmt: skip
    ctx = RunContext(out=tmp_path / "toy", progress=False)
    with pytest.raises(OptionError, match="--k 2: refused"):
        sweep_policies(toy_preset(ZeroHeads(), check=check), m, data, heads, ks=["2"], granularity=None,
                       warn=lambda _: None, ctx=ctx, **common)  # fmt: skip
    assert not (tmp_path / "toy").exists()
