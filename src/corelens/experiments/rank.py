"""Rank heads by a registered head score (RAM by default): samples -> per-head score -> ram.parquet,
heads.csv, heatmap.

The score is a `Scorer` of `corelens.experiments.scorers` (`--score NAME`: ram, retrieval, outside-window,
causal, ...); every scorer's records make the same tables, so the `mass` column of ram.parquet and heads.csv
holds the chosen score and the manifest's settings name it (key `score`, absent for RAM). ram.parquet has one
row per (sample, layer, head); with RAM, its `views` column lists, per view of the prompt (base view, tile,
thumbnail, page, frame group: `Layout.views()`), the head's mass on the view, its mass on Ω ∩ view, their
ratio (the view's Ω share) and the view's token counts.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from corelens.capture.omega import OmegaSettings
from corelens.data.sample import Sample
from corelens.errors import warn
from corelens.experiments.configs import RankConfig
from corelens.experiments.scorers import ScoreJob, Scorer, scorer_of

# RAM's per-sample measure lives with its scorer; kept importable from here, where it was.
from corelens.experiments.scorers.ram_mass import SampleRam, measure_sample, prepare_for  # noqa: F401
from corelens.metrics.headsets import k_count, parse_k
from corelens.metrics.kvheads import check_granularity, group_size, kv_frame, mark_kv
from corelens.metrics.posterior import few_samples
from corelens.metrics.ram import head_table, sample_frame, top_heads
from corelens.metrics.uncertainty import bootstrap_heads, uncertain_heads
from corelens.models.loaded import Loaded, load
from corelens.runs import Run
from corelens.runs.context import RunContext
from corelens.runs.outputs import RANK, conclude


@dataclass
class Ranking:
    """A rank result: the per-sample long table and the per-head table (rank 1 = highest mean mass).

    `ram` is always per query head. With `granularity="kv"`, `heads` ranks KV heads (`head` is the KV head,
    `query_heads` its members; `corelens.metrics.kvheads`) and `query_table` keeps the query-head table.
    """

    ram: pd.DataFrame
    heads: pd.DataFrame
    granularity: str = "query"
    query_table: pd.DataFrame | None = None

    def top(self, k: int | float) -> list[tuple[int, int]]:
        """Return the top-k (layer, head) pairs (KV heads at KV granularity); a float in (0, 1) is a share."""
        return top_heads(self.heads, k)


# rank()'s keyword arguments of earlier releases, and those it names differently from the command line.
_ALIASES = {"ks": "k", "boot_seed": "seed"}
_CONTEXT = ("out", "argv", "progress", "skip_bad", "limit", "limits")


def rank_config(config: RankConfig | None, options: dict) -> tuple[RankConfig, dict]:
    """Return `config` (the Python defaults: no overlays) amended by `rank()`'s keyword `options`, and the
    options that belong to the run context. `omega` may be an `OmegaSettings` (the causal estimator's)."""
    base = config if config is not None else RankConfig(overlays=0)
    context = {k: options.pop(k) for k in _CONTEXT if k in options}
    fields = {_ALIASES.get(k, k): v for k, v in options.items()}
    omega = fields.get("omega")
    if isinstance(omega, OmegaSettings):
        fields.update(
            omega="causal",
            estimator=omega.estimator,
            omega_grid=omega.grid,
            omega_refine=omega.refine,
            omega_ratio=omega.ratio,
            omega_batch=omega.batch,
        )
    elif omega is None and "omega" in fields:
        fields["omega"] = "targets"
    return replace(base, **fields), context


def rank(
    m: Loaded, data: str | Path, config: RankConfig | None = None, *, ctx: RunContext | None = None, **options
) -> Ranking:
    """Rank the heads of `m` by RAM over the samples of `data`; with an output folder, write a resumable run.

    `config` holds the settings (`RankConfig`: those of `corelens rank`), `ctx` the run (`RunContext`: the
    output folder `out`, `skip_bad`, `limit`, `limits`, `progress`, `argv`). Keyword `options` set either,
    by their names here or by earlier releases' (`ks` for `k`, `boot_seed` for `seed`; `omega` an
    `OmegaSettings`); without a config, rank() draws no overlays.

    The head table also carries `n_boot` seeded bootstrap intervals of each head's mass and rank and its
    probability of being in the top-k for each of `k` (counts or shares; column `p_top{k}`; None: none).
    `overlays` > 0 also draws the top and bottom heads' attention on the first `overlays` ranked samples;
    `explorer` > 0 stores the head explorer's attention maps of the first `explorer` ranked samples.
    Under torchrun every rank measures its share of the samples and rank 0 writes the tables.
    `score` picks the head score (docs/methods.md#head-scores): a registered name ("ram", the default;
    "retrieval", "outside-window", "causal", ...; its settings as keywords, e.g. `sink="4", window="16"`),
    a `Scorer` (`corelens.experiments.scorers`) or its `to_dict()`; the `mass` columns then hold that score.
    `omega="causal"` estimates each sample's Omega from the model instead of its targets
    (`--omega causal`, docs/methods.md#causal-omega): samples need no targets.
    `granularity="kv"` ranks KV heads, each scored by `kv_rule` ("sum", "mean" or "max") over its query
    heads' RAM (docs/methods.md#kv-heads); `k` then counts KV heads. Like `k`, the granularity is
    post-processing of the logged samples: a resumed run may ask for the other one.

    Examples:
        >>> import corelens as cl
        >>> from corelens.organism import organism_path
        >>> from corelens.organism.tasks import generate
        >>> data = generate("image", getfixture("tmp_path"), 8, seed=1)
        >>> ranking = cl.rank(cl.load(organism_path(), device="cpu"), data, query="answer")
        >>> len(ranking.heads), ranking.top(2)
        (32, [(0, 7), (0, 5)])
        >>> m = cl.load(organism_path(), device="cpu")
        >>> kv = cl.rank(m, data, query="answer", granularity="kv", ks=None)
        >>> len(kv.heads), kv.top(1), kv.heads["query_heads"][0]  # KV head 1 of layer 0 holds heads 4-7
        (8, [(0, 1)], '4 5 6 7')
        >>> lost = cl.rank(m, data, query="answer", score="outside-window", sink="4", window="16", ks=None)
        >>> lost.top(2), round(float(lost.heads["mass"][0]), 2)  # L0H7: 94 % of its attention beyond S + W
        ([(0, 7), (3, 4)], 0.94)
    """
    from corelens.models.loaded import as_loaded

    m = as_loaded(m, "corelens.rank")  # a bare transformers model is wrapped (Loaded.from_model)
    options = dict(options)
    given = options.pop("score") if isinstance(options.get("score"), (Scorer, dict)) else None
    cfg, context = rank_config(config, options)
    scorer = scorer_of(given if given is not None else cfg.score, cfg)
    ctx = RunContext.of(ctx, **context)
    check_granularity(cfg.granularity)
    samples, skipped = ctx.read(data)
    run = ctx.open("rank", score_settings(cfg.settings(m, data, ctx), scorer), device=m.device)
    omega = cfg.omega_settings
    if (
        omega is not None and ctx.progress and ctx.main
    ):  # minutes a sample: say what each costs before it starts
        print(f"rank: --omega causal ({omega.estimator}) on {len(samples)} samples: {omega.cost()}; the first "
              "sample's time gives the estimate of the rest", file=sys.stderr, flush=True)  # fmt: skip
    logged = scorer.score(m, samples, ScoreJob(cfg, ctx, run, skipped=skipped))
    records = [r for r in logged if r["status"] == "ok"]
    ranking, uncertainty, group = _tables(m, records, cfg)
    message = few_samples(len(records)) if len(records) != 1 else None
    if len(records) == 1 and records[0]["id"] == "all" and cfg.k is not None and ctx.main:
        message = f"the {scorer.name} score is one optimisation over all samples: heads.csv has no intervals or P(top-k)"
    if message and ctx.main:
        warn(message)  # below the size tests/test_calibration.py checks the intervals at
    if run is None or not run.dist.main:
        conclude(run, RANK, {})
        return ranking

    def draw(paths: dict[str, Path]) -> None:
        _figures(m, ranking, samples, records, run, cfg, ctx, uncertainty, group, paths, scorer.label)

    manifest = {"uncertainty": uncertainty} if uncertainty else {}
    manifest["granularity"] = {
        "granularity": cfg.granularity,
        "kv_rule": cfg.kv_rule if cfg.granularity == "kv" else None,
        "query_heads_per_kv_head": group,
        "ranked_heads": len(ranking.heads),
    }
    skipped_n = sum(1 for r in logged if r["status"] == "skipped")
    tables = {"ram": ranking.ram, "heads": ranking.heads}
    conclude(run, RANK, tables, draw=draw, manifest=manifest, samples=len(records), skipped=skipped_n)
    return ranking


def score_settings(settings: dict, scorer: Scorer) -> dict:
    """Return a rank run's manifest settings with its scorer (`to_dict`): absent for RAM, as before scorers."""
    return settings if scorer.name == "ram" else {**settings, "score": scorer.to_dict()}


def _tables(m: Loaded, records: list[dict], cfg: RankConfig) -> tuple[Ranking, dict | None, int]:
    """Return the ranking of the logged `records` (per query or KV head, with the bootstrap columns), the
    manifest's uncertainty entry (None without `k`) and the query heads per KV head."""
    ranking = _ranking(records)
    # The table ranked: per query head, or per KV head with the rule applied to each sample's members.
    group = group_size(m.num_heads, m.num_kv_heads)
    kv = cfg.granularity == "kv"
    scored = kv_frame(ranking.ram, group, cfg.kv_rule) if kv else ranking.ram
    if kv:
        ranking = Ranking(ranking.ram, mark_kv(head_table(scored), group), "kv", ranking.heads)
    uncertainty = None
    # One record (a scorer optimised over all samples at once: gates, greedy) has no sampling spread to
    # resample: its table carries no intervals rather than ones that measure nothing.
    if cfg.k is not None and len(ranking.heads) and len(records) > 1:
        # Post-processing of the logged samples, not a run setting: a resume may ask for other k values.
        ks = parse_k(cfg.k)
        counts = sorted({k_count(k, len(ranking.heads)) for k in ks})
        table = bootstrap_heads(scored, counts, n_boot=cfg.n_boot, seed=cfg.seed)
        ranking.heads = mark_kv(table, group) if kv else table
        uncertainty = {"k": ks, "counts": counts, "n_boot": cfg.n_boot, "seed": cfg.seed}
    return ranking, uncertainty, group


def _figures(
    m: Loaded,
    ranking: Ranking,
    samples: list[Sample],
    records: list[dict],
    run: Run,
    cfg: RankConfig,
    ctx: RunContext,
    uncertainty: dict | None,
    group: int,
    paths: dict[str, Path],
    label: str = "RAM",
) -> None:
    """Draw the head heatmap, and the overlays and explorer maps the config asks for."""
    from corelens.report.heatmap import head_heatmap

    kv_title = f", KV heads: {cfg.kv_rule} of {group} query heads" if cfg.granularity == "kv" else ""
    head_heatmap(
        ranking.heads,
        paths["heads_mass"],
        title=f"Mean {label} ({cfg.query} queries{kv_title})",
        marked=uncertain_heads(ranking.heads) if uncertainty else None,
    )
    # Overlays and the explorer draw query heads' attention maps: they read the query-head table.
    by_query = ranking.heads if ranking.query_table is None else ranking.query_table
    if cfg.overlays > 0:
        from corelens.attention.probes import KeyMapProbe
        from corelens.capture import attention_maps
        from corelens.report.overlay import top_bottom, write_overlays

        ranked = {r["id"] for r in records}
        chosen = [s for s in samples if s.id in ranked][: cfg.overlays]
        if ctx.progress:  # a figure of heads x pictures: seconds without another line
            print(f"drawing the attention overlays of {len(chosen)} sample(s)", flush=True)
        top, bottom = top_bottom(by_query)
        probe = KeyMapProbe(top + bottom)  # one probe: each forward's context gives its rows
        measured = ((s, *attention_maps(m, s, top + bottom, cfg.query, probe)) for s in chosen)
        write_overlays(measured, top, bottom, run.path / "figures")
    if cfg.explorer > 0:
        _explorer(m, samples, records, by_query, run, cfg.explorer, cfg.query)


def _explorer(
    m: Loaded, samples: list[Sample], records: list[dict], heads: pd.DataFrame, run: Run, n: int, query: str
):
    """Store the head explorer's maps of the first `n` ranked samples and print their size and bound."""
    from corelens.capture import attention_maps
    from corelens.report.explorer import bound_bytes, explorer_heads, write_explorer

    ranked = {r["id"] for r in records}
    chosen = [s for s in samples if s.id in ranked][:n]
    kept = explorer_heads(heads, len(chosen))
    measured = ((s, *attention_maps(m, s, hs, query), hs) for s, hs in zip(chosen, kept))
    path, size = write_explorer(((s, p, hs, maps) for s, p, maps, hs in measured), run.path)
    bound = bound_bytes(len(heads), len(chosen))
    print(
        f"explorer maps: {size / 1e6:.2f} MB in {path.name} (bound {bound / 1e6:.2f} MB before compression)"
    )


def _ranking(records: list[dict]) -> Ranking:
    ram = sample_frame(records)
    return Ranking(ram, head_table(ram))


def rank_path(
    model: str | Path, data: str | Path, out: str | Path, *, load_options: dict | None = None, **kwargs
) -> Ranking:
    """Load `model` (with `load()`'s `load_options`: device, dtype, device_map, ...) and rank into `out`."""
    return rank(load(model, **(load_options or {})), data, out=out, **kwargs)


def run_command(config: RankConfig, ctx: RunContext, load_options: dict) -> Ranking:
    """`corelens rank`: load the config's model and rank its data under `ctx`."""
    return rank(load(config.model, **load_options), config.data, config, ctx=ctx)
