"""One experiment shape (issue 30): each sample prepared once per step, options generated from a config, the
run context passed once, and the outputs written and read through one declaration. The experiments checked
are the experiment registry's (corelens.experiment_registry): a new one's options are checked with no line added.

The organism (src/corelens/organism/checkpoint) answers two generated document samples in every run here; each
sweep has two conditions (the unmodified model and one set), both answered from the one prepared sample.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import fields

import pandas as pd
import pytest

import corelens as cl
from corelens.cli import Parser
from corelens.commands.options import add_config, config_of, context_of, named
from corelens.experiment_registry import EXPERIMENTS, experiments
from corelens.experiments.ablate import sweep
from corelens.experiments.configs import ImportanceConfig, RankConfig
from corelens.experiments.hybrid import curve
from corelens.experiments.sap import sap
from corelens.models import prepare as prepare_module
from corelens.organism import organism_path
from corelens.organism.tasks import generate
from corelens.runs import Run
from corelens.runs.context import RunContext
from corelens.runs.fields import RunOptions, meta, settings
from corelens.runs.outputs import OUTPUTS, Outputs, conclude

N = 2


@pytest.fixture(scope="module")
def organism():
    return cl.load(organism_path(), device="cpu")


@pytest.fixture(scope="module")
def ranked(organism, tmp_path_factory):
    """Three document samples and a rank run of them (its heads.csv is what the sweeps read)."""
    folder = tmp_path_factory.mktemp("shape")
    data = generate("document", folder / "data", N, seed=3)
    cl.rank(organism, data, out=folder / "rank", ks=None)
    return data, folder / "rank" / "heads.csv"


@pytest.fixture
def prepares(monkeypatch):
    """Count `prepare` calls by sample id, wherever a module imported the function."""
    counts: Counter = Counter()
    original = prepare_module.prepare

    def counting(m, sample, *args, **kwargs):
        counts[sample.id] += 1
        return original(m, sample, *args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.startswith("corelens") and getattr(module, "prepare", None) is original:
            monkeypatch.setattr(module, "prepare", counting)
    return counts


def _rank(m, data, heads):
    cl.rank(m, data, ks=None)


def _ablate(m, data, heads):
    sweep(m, data, heads, ks=("2",), sets=("top",), op="zero", max_new_tokens=2, warn=lambda _: None)


def _hybrid(m, data, heads):
    curve(
        m, data, heads, keeps=("2",), sets=("top",), sink=4, window=8, max_new_tokens=2, warn=lambda _: None
    )


def _hybrid_shares(m, data, heads):
    curve(
        m, data, heads, keeps=("2",), sets=("top",), sink="5%", window="25%", max_new_tokens=2,
        warn=lambda _: None,
    )  # fmt: skip


def _sap(m, data, heads):
    sap(m, data, priors=("noise",), layers=("late",), max_new_tokens=2)


# The driver prepares each sample once and hands it to the step, which answers every condition from it.
# hybrid with S or W a share of the median prompt also measures each prompt's length once before its loop
# (the share needs the median before the first answer); with token counts the median comes from the answers.
# (The experiment modules are imported above, so that the fixture finds their `prepare`.)
# Registered experiment -> its small runs here, each (id, run, prepares per sample); `test_small_runs_are_experiments`
# keeps the keys to the experiment registry.
SMALL_RUNS = {
    "rank": [("rank", _rank, 1)],
    "ablate": [("ablate", _ablate, 1)],
    "hybrid": [("hybrid", _hybrid, 1), ("hybrid-shares", _hybrid_shares, 2)],
    "sap": [("sap", _sap, 1)],
}


def test_small_runs_are_experiments():
    assert set(SMALL_RUNS) <= set(EXPERIMENTS)


@pytest.mark.parametrize(
    "run, per_sample",
    [pytest.param(run, n, id=i) for e in experiments() for i, run, n in SMALL_RUNS.get(e.name, [])],
)
def test_each_sample_is_prepared_once_per_step(organism, ranked, prepares, run, per_sample):
    data, heads = ranked
    run(organism, data, heads)
    assert len(prepares) == N
    assert set(prepares.values()) == {per_sample}, prepares


def test_hybrid_reads_the_median_prompt_off_the_answers_when_s_and_w_are_token_counts(organism, ranked):
    data, heads = ranked
    common = dict(keeps=("2",), sets=("top",), max_new_tokens=1, warn=lambda _: None)
    counted = curve(organism, data, heads, sink=4, window=8, **common)  # no length pass
    measured = curve(organism, data, heads, sink="5%", window="25%", **common)  # the length pass
    tokens = counted.records.drop_duplicates("sample")["tokens"]
    assert counted.median_tokens == measured.median_tokens == float(tokens.median())


def test_equal_policies_share_one_answer(monkeypatch):
    """The sweeps' step answers each distinct policy once per sample, in the conditions' order."""
    import corelens.experiments.policy_sweep as policy_sweep

    asked = []

    def fake_answer(m, prepared, policy, *, stats, **kw):
        asked.append(policy)
        stats["policy"] = policy
        return f"under {policy}"

    monkeypatch.setattr(policy_sweep, "answer", fake_answer)
    todo = [(None, None), ("a", "A"), ("b", "B"), ("a", "A")]
    got = list(policy_sweep.answer_each(None, None, None, todo, max_new_tokens=1))
    assert asked == [None, "A", "B"]
    assert got == [("under None", {"policy": None}), ("under A", {"policy": "A"}),
                   ("under B", {"policy": "B"}), ("under A", {"policy": "A"})]  # fmt: skip


# Every registered experiment's config (corelens.experiment_registry), by command.
CONFIGS = {e.name: named(e.config) for e in experiments()}


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS)
def test_options_are_the_configs_fields(config):
    """Every option of the generated parser is a field of the config (or the shared model block), and the
    parsed defaults build the config's own defaults."""
    parser = Parser(prog="x")
    add_config(parser, config)
    dests = {a.dest for a in parser._actions} - {"help"}
    blocks = {
        "model": {
            "model",
            "revision",
            "device",
            "dtype",
            "device_map",
            "max_memory",
            "offload_folder",
            "allow_other_model",
        },
        "run": {f.name for f in fields(RunOptions)},
    }
    names = {f.name for f in fields(config) if meta(f)}
    expected = set().union(*(blocks.get(n, {n}) for n in names))
    assert dests == expected
    required = [
        f"--{f.name.replace('_', '-')}"
        for f in fields(config)
        if meta(f).get("required") and not meta(f)["positional"] and not meta(f)["group"]
    ]
    given = [v for flag in required for v in (flag, ".")] + (["--model", "m"] if "model" in names else [])
    built = config_of(config, parser.parse_args(given))
    for f in fields(config):
        if meta(f) and not meta(f)["required"] and not meta(f)["positional"] and not meta(f)["group"]:
            assert getattr(built, f.name) == f.default, f.name


def test_rank_options_reach_the_config_and_the_context(tmp_path):
    parser = Parser(prog="x")
    add_config(parser, RankConfig)
    data = generate("document", tmp_path, 1, seed=3)
    argv = [
        "--model",
        "m",
        "--data",
        str(data),
        "--out",
        str(tmp_path / "r"),
        "--k",
        "8",
        "--omega",
        "causal",
    ]
    args = parser.parse_args([*argv, "--limit", "2", "--skip-bad", "--max-pages", "5", "--omega-batch", "3"])
    config, ctx = config_of(RankConfig, args), context_of(args, progress=False)
    assert (config.k, config.omega, config.omega_settings.batch) == ("8", "causal", 3)
    assert (ctx.out, ctx.limit, ctx.skip_bad, ctx.limits.max_pages) == (str(tmp_path / "r"), 2, True, 5)


def test_run_context_takes_earlier_keywords_and_refuses_others():
    ctx = RunContext.of(None, out="run", skip_bad=True)
    assert RunContext.of(ctx, limit=3) == RunContext(out="run", skip_bad=True, limit=3)
    with pytest.raises(TypeError, match="unknown run context fields: outt"):
        RunContext.of(ctx, outt="run")


def test_settings_are_the_setting_fields():
    keys = settings(ImportanceConfig())
    assert "out" not in keys and "max_pixels" not in keys and "heads" not in keys and "model" not in keys
    assert {"op", "keys", "method", "limit", "skip_bad"} <= set(keys)


def test_conclude_writes_the_declared_tables_and_figures(tmp_path):
    run = Run(tmp_path / "run", "flow", {})
    frame = pd.DataFrame({"a": [1]})
    drawn = []
    conclude(
        run, OUTPUTS["flow"], {"frame": frame, "table": frame, "layers": None}, draw=drawn.append, samples=1
    )
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.is_file()) == [
        "flow.parquet",
        "manifest.json",
        "table1.csv",
    ]
    assert drawn == [{"flow_layers": tmp_path / "run" / "figures" / "flow_layers.png"}]
    with pytest.raises(KeyError, match="declares no table"):
        conclude(Run(tmp_path / "other", "flow", {}), OUTPUTS["flow"], {"table1": frame})


def test_an_output_key_names_one_file():
    with pytest.raises(ValueError, match="declared twice"):
        Outputs("x", {"a": "a.csv"}, {"a": "figures/a.png"})
    assert {o.summary_file for o in OUTPUTS.values()} >= {"heads.csv", "ablation.csv", "hybrid.csv"}


def test_every_run_command_is_generated_from_its_config():
    """The commands that run an experiment build their parser from a config (none add options by hand)."""
    from corelens.cli import parser

    p = parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    assert set(CONFIGS) <= set(sub.choices)
    for command, config in CONFIGS.items():
        built = Parser(prog="x")
        add_config(built, config)
        theirs = [(a.option_strings, a.dest, a.default, a.help) for a in sub.choices[command]._actions]
        ours = [(a.option_strings, a.dest, a.default, a.help) for a in built._actions]
        assert theirs == ours, command
