"""Rank heads by Retrieval Attention Mass: samples -> per-head RAM -> ram.parquet, heads.csv, heatmap.

ram.parquet has one row per (sample, layer, head); its `views` column lists, per view of the prompt (base
view, tile, thumbnail, page, frame group: `Layout.views()`), the head's mass on the view, its mass on
Ω ∩ view, their ratio (the view's Ω share) and the view's token counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from corelens.attention import RamProbe, activate
from corelens.attention.prompt_context import AttentionContext, attention_context
from corelens.data.sample import Sample
from corelens.errors import InputError, warn
from corelens.experiments.configs import RankConfig
from corelens.experiments.omega import OmegaSettings, estimate_omega
from corelens.metrics.headsets import k_count, parse_k
from corelens.metrics.kvheads import check_granularity, group_size, kv_frame, mark_kv
from corelens.metrics.posterior import few_samples
from corelens.metrics.ram import head_table, sample_frame, top_heads
from corelens.metrics.uncertainty import bootstrap_heads, uncertain_heads
from corelens.models.loaded import Loaded, load
from corelens.models.prepare import Prepared, prepare, prompt_length
from corelens.runs import Run
from corelens.runs.context import RunContext
from corelens.runs.driver import Loop
from corelens.runs.outputs import RANK, conclude


@dataclass
class SampleRam:
    """RAM of one sample: (layers, heads) arrays of mass, visual share and lift, and the set sizes.

    Per view (`views`: labels of `Layout.views()`): `view_mass` (layers, heads, views, 2) holds each view's
    mass and its mass on Ω; `view_tokens` / `view_omega` count the view's tokens in V and in Ω.
    """

    mass: np.ndarray
    share: np.ndarray
    lift: np.ndarray
    n_omega: int
    n_visual: int
    views: list[str] = field(default_factory=list)
    view_mass: np.ndarray | None = None
    view_tokens: list[int] = field(default_factory=list)
    view_omega: list[int] = field(default_factory=list)


def measure_sample(
    m: Loaded,
    sample: Sample,
    query: str = "question",
    rule: str = "any",
    padding: str = "visual",
    omega: np.ndarray | None = None,
    prepared: Prepared | None = None,
    probe: RamProbe | None = None,
) -> SampleRam:
    """Return the RAM of every (layer, query head) for one sample, from a single probed forward.

    `padding` is the padding-cell rule of Omega and V (`corelens.layout.PADDING_RULES`); `omega`, if given,
    is an estimated Omega (token positions, `corelens.experiments.omega`) used instead of the targets'.
    `probe`: a `RamProbe(layers, heads, views=True)` built without positions, shared by a run's samples.

    Examples:
        >>> import corelens as cl
        >>> from corelens.organism import organism_path
        >>> from corelens.organism.tasks import generate
        >>> m = cl.load(organism_path(), device="cpu")
        >>> samples, _ = cl.read_samples(generate("image", getfixture("tmp_path"), 1, seed=1))
        >>> r = cl.measure_sample(m, samples[0], query="answer")
        >>> r.mass.shape, r.n_omega, r.n_visual
        ((4, 8), 1, 36)
        >>> r.mass[0].round(2).tolist()  # layer 0: heads 5 and 7 put half their attention on Ω
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.15, 0.5]
    """
    prepared = prepared if prepared is not None else prepare_for(m, sample, query, padding)
    if query == "answer" and sample.answer is None:
        raise InputError(
            "query 'answer' needs an answer", file=sample.source, line=sample.line, sample=sample.id
        )
    omega = prepared.layout.omega(sample.targets, rule, sample=sample.id) if omega is None else omega
    visual = prepared.layout.visual
    if not len(omega):
        raise InputError(
            "the targets cover no visual token", file=sample.source, line=sample.line, sample=sample.id
        )
    views = prepared.layout.views()
    probe = probe if probe is not None else RamProbe(m.num_layers, m.num_heads, views=True)
    # The probed rows may be the answer's: the context carries them, with this sample's Omega.
    context = AttentionContext.of(prepared, omega=omega, sample=sample, query_rows=prepared.rows(query))
    with torch.no_grad(), attention_context(context), activate(m.layer_modules(), probe):
        m.model(**prepared.to(m.device), use_cache=False, logits_to_keep=1)
    mass = probe.mass.double().numpy()
    vis = probe.visual_mass.double().numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(vis > 0, mass / vis, np.nan)
    lift = share / (len(omega) / len(visual))
    return SampleRam(
        mass,
        share,
        lift,
        len(omega),
        len(visual),
        [label for label, _ in views],
        probe.view_mass.double().numpy(),
        [len(tokens) for _, tokens in views],
        [int(np.isin(tokens, omega).sum()) for _, tokens in views],
    )


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


def _record(sample: Sample, result: SampleRam) -> dict:
    return {
        "id": sample.id,
        "task": sample.task,
        "status": "ok",
        "n_omega": result.n_omega,
        "n_visual": result.n_visual,
        "mass": result.mass.tolist(),
        "share": result.share.tolist(),
        "lift": result.lift.tolist(),
        "views": result.views,
        "view_mass": result.view_mass.tolist() if result.view_mass is not None else [],
        "view_tokens": result.view_tokens,
        "view_omega": result.view_omega,
    }


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


def check_record(layers: int, heads: int, record: dict) -> None:
    """Raise ValueError naming the field when a logged rank record's per-head arrays are not `layers` x
    `heads` numbers (a resumed run reads records it did not write in this process).

    Examples:
        >>> check_record(1, 2, {"mass": [[0.5, 0.1]], "share": [[1, 0]], "lift": [[2, 0]]})
        >>> check_record(1, 2, {"mass": [0.5, 0.1], "share": [[1, 0]], "lift": [[2, 0]]})
        Traceback (most recent call last):
        ...
        ValueError: field 'mass': expected 1 x 2 numbers, got shape (2,)
    """
    for name in ("mass", "share", "lift"):
        try:
            values = np.asarray(record[name], dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"field {name!r}: not an array of numbers") from None
        if values.shape != (layers, heads):
            raise ValueError(f"field {name!r}: expected {layers} x {heads} numbers, got shape {values.shape}")


def prepare_for(m: Loaded, sample: Sample, query: str = "question", padding: str = "visual") -> Prepared:
    """Prepare `sample` as RAM measures it: the answer appended for `query="answer"` (teacher forcing)."""
    return prepare(m, sample, answer=sample.answer if query == "answer" else None, padding=padding)


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
    """
    from corelens.models.loaded import as_loaded

    m = as_loaded(m, "corelens.rank")  # a bare transformers model is wrapped (Loaded.from_model)
    cfg, context = rank_config(config, dict(options))
    ctx = RunContext.of(ctx, **context)
    check_granularity(cfg.granularity)
    samples, skipped = ctx.read(data)
    run = ctx.open("rank", cfg.settings(m, data, ctx), device=m.device)
    omega = cfg.omega_settings
    query, rule, padding = cfg.query, cfg.rule, cfg.padding
    probe = RamProbe(
        m.num_layers, m.num_heads, views=True
    )  # one probe: each forward's context gives the sets

    def step(sample: Sample, done: set[str], prepared: Prepared) -> list[dict]:
        if omega is not None:
            # The driver's prompt is Ω's own unless the answer was appended to it (--query answer).
            tokens, _ = estimate_omega(m, sample, omega, padding, None if query == "answer" else prepared)
            if not len(tokens):
                reason = "estimated Ω is empty: no visual cell lowers the answer's log-probability"
                return [{"id": sample.id, "status": "skipped", "line": sample.line, "reason": reason}]
            return [_record(sample, measure_sample(m, sample, query, rule, padding, tokens, prepared, probe))]
        if not sample.targets:
            # A question kept for scoring without evidence (MMLongBench-Doc "[]"): RAM needs Ω.
            reason = "no evidence target: RAM needs Ω"
            return [{"id": sample.id, "status": "skipped", "line": sample.line, "reason": reason}]
        return [
            _record(sample, measure_sample(m, sample, query, rule, padding, prepared=prepared, probe=probe))
        ]

    loop = Loop(
        "rank",
        step,
        length=partial(prompt_length, m),
        prepare=lambda sample: prepare_for(m, sample, query, padding),
        check=partial(check_record, m.num_layers, m.num_heads),
    )
    logged = ctx.drive(loop, samples, run, skipped)
    records = [r for r in logged if r["status"] == "ok"]
    ranking, uncertainty, group = _tables(m, records, cfg)
    message = few_samples(len(records))
    if message and ctx.main:
        warn(message)  # below the size tests/test_calibration.py checks the intervals at
    if run is None or not run.dist.main:
        conclude(run, RANK, {})
        return ranking

    def draw(paths: dict[str, Path]) -> None:
        _figures(m, ranking, samples, records, run, cfg, ctx, uncertainty, group, paths)

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
    if cfg.k is not None and len(ranking.heads):
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
) -> None:
    """Draw the head heatmap, and the overlays and explorer maps the config asks for."""
    from corelens.report.heatmap import head_heatmap

    kv_title = f", KV heads: {cfg.kv_rule} of {group} query heads" if cfg.granularity == "kv" else ""
    head_heatmap(
        ranking.heads,
        paths["heads_mass"],
        title=f"Mean RAM ({cfg.query} queries{kv_title})",
        marked=uncertain_heads(ranking.heads) if uncertainty else None,
    )
    # Overlays and the explorer draw query heads' attention maps: they read the query-head table.
    by_query = ranking.heads if ranking.query_table is None else ranking.query_table
    if cfg.overlays > 0:
        from corelens.report.overlay import write_overlays

        ranked = {r["id"] for r in records}
        chosen = [s for s in samples if s.id in ranked][: cfg.overlays]
        if ctx.progress:  # a figure of heads x pictures: seconds without another line
            print(f"drawing the attention overlays of {len(chosen)} sample(s)", flush=True)
        write_overlays(m, chosen, by_query, run.path / "figures", query=cfg.query)
    if cfg.explorer > 0:
        _explorer(m, samples, records, by_query, run, cfg.explorer, cfg.query)


def _explorer(
    m: Loaded, samples: list[Sample], records: list[dict], heads: pd.DataFrame, run: Run, n: int, query: str
):
    """Store the head explorer's maps of the first `n` ranked samples and print their size and bound."""
    from corelens.report.explorer import bound_bytes, write_explorer

    ranked = {r["id"] for r in records}
    chosen = [s for s in samples if s.id in ranked][:n]
    path, size = write_explorer(m, chosen, heads, run.path, query=query)
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
