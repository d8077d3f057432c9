"""Rank heads by Retrieval Attention Mass: samples -> per-head RAM -> ram.parquet, heads.csv, heatmap.

ram.parquet has one row per (sample, layer, head); its `views` column lists, per view of the prompt (base
view, tile, thumbnail, page, frame group: `Layout.views()`), the head's mass on the view, its mass on
Ω ∩ view, their ratio (the view's Ω share) and the view's token counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from corelens.attention import RamProbe, activate
from corelens.data.sample import Limits, Sample, read_samples
from corelens.errors import InputError, warn
from corelens.experiments.omega import OmegaSettings, estimate_omega
from corelens.metrics.headsets import k_count, parse_k
from corelens.metrics.kvheads import DEFAULT_RULE, check_granularity, group_size, kv_frame, mark_kv
from corelens.metrics.posterior import few_samples
from corelens.metrics.ram import head_table, sample_frame, top_heads
from corelens.metrics.uncertainty import bootstrap_heads, uncertain_heads
from corelens.models.loaded import Loaded, load
from corelens.models.prepare import prepare, prompt_length
from corelens.runs import Run, current, model_data_settings
from corelens.runs.driver import Loop, drive


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
) -> SampleRam:
    """Return the RAM of every (layer, query head) for one sample, from a single probed forward.

    `padding` is the padding-cell rule of Omega and V (`corelens.layout.PADDING_RULES`); `omega`, if given,
    is an estimated Omega (token positions, `corelens.experiments.omega`) used instead of the targets'.

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
    prepared = prepare(m, sample, answer=sample.answer if query == "answer" else None, padding=padding)
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
    probe = RamProbe(
        m.num_layers,
        m.num_heads,
        torch.from_numpy(prepared.rows(query)),
        torch.from_numpy(omega),
        torch.from_numpy(visual),
        prepared.seq_len,
        views=[torch.from_numpy(tokens) for _, tokens in views],
    )
    inputs = {k: v.to(m.device) if hasattr(v, "to") else v for k, v in prepared.inputs.items()}
    with torch.no_grad(), activate(m.layer_modules(), probe):
        m.model(**inputs, use_cache=False, logits_to_keep=1)
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


def rank(
    m: Loaded,
    data: str | Path,
    *,
    query: str = "question",
    rule: str = "any",
    padding: str = "visual",
    limit: int | None = None,
    out: str | Path | None = None,
    skip_bad: bool = False,
    limits: Limits | None = None,
    progress: bool = False,
    overlays: int = 0,
    explorer: int = 0,
    ks: str | list[str] | None = "1%,5%,10%",
    n_boot: int = 1000,
    boot_seed: int = 0,
    argv: list[str] | None = None,
    omega: OmegaSettings | None = None,
    granularity: str = "query",
    kv_rule: str = DEFAULT_RULE,
) -> Ranking:
    """Rank the heads of `m` by RAM over the samples of `data`; with `out`, write a resumable run dir.

    The head table also carries `n_boot` seeded bootstrap intervals of each head's mass and rank and its
    probability of being in the top-k for each of `ks` (counts or shares; column `p_top{k}`; None: none).
    `overlays` > 0 also draws the top and bottom heads' attention on the first `overlays` ranked samples;
    `explorer` > 0 stores the head explorer's attention maps of the first `explorer` ranked samples.
    Under torchrun every rank measures its share of the samples and rank 0 writes the tables.
    `omega` (an `OmegaSettings`) estimates each sample's Omega from the model instead of its targets
    (`--omega causal`, docs/methods.md#causal-omega): samples need no targets.
    `granularity="kv"` ranks KV heads, each scored by `kv_rule` ("sum", "mean" or "max") over its query
    heads' RAM (docs/methods.md#kv-heads); `ks` then count KV heads. Like `ks`, the granularity is
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
    check_granularity(granularity)
    samples, skipped = read_samples(data, skip_bad=skip_bad, limit=limit, limits=limits)
    run = None
    if out is not None:
        settings = {
            **model_data_settings(m, data),
            "query": query,
            "rule": rule,
            "padding": padding,
            "limit": limit,
            "skip_bad": skip_bad,
            "seed": 0,
            "omega": {"source": "causal", **omega.to_json()} if omega else {"source": "targets"},
        }
        run = Run(out, "rank", settings, argv, dist=current(), device=m.device)

    def step(sample: Sample, done: set[str]) -> list[dict]:
        if omega is not None:
            tokens, _ = estimate_omega(m, sample, omega, padding)
            if not len(tokens):
                reason = "estimated Ω is empty: no visual cell lowers the answer's log-probability"
                return [{"id": sample.id, "status": "skipped", "line": sample.line, "reason": reason}]
            return [_record(sample, measure_sample(m, sample, query, rule, padding, omega=tokens))]
        if not sample.targets:
            # A question kept for scoring without evidence (MMLongBench-Doc "[]"): RAM needs Ω.
            reason = "no evidence target: RAM needs Ω"
            return [{"id": sample.id, "status": "skipped", "line": sample.line, "reason": reason}]
        return [_record(sample, measure_sample(m, sample, query, rule, padding))]

    loop = Loop("rank", step, length=partial(prompt_length, m))
    logged = drive(loop, samples, run=run, skipped=skipped, skip_bad=skip_bad, progress=progress)
    records = [r for r in logged if r["status"] == "ok"]
    ranking = _ranking(records)
    # The table ranked: per query head, or per KV head with the rule applied to each sample's members.
    group = group_size(m.num_heads, m.num_kv_heads)
    scored = kv_frame(ranking.ram, group, kv_rule) if granularity == "kv" else ranking.ram
    if granularity == "kv":
        ranking = Ranking(ranking.ram, mark_kv(head_table(scored), group), "kv", ranking.heads)
    uncertainty = None
    if ks is not None and len(ranking.heads):
        # Post-processing of the logged samples, not a run setting: a resume may ask for other k values.
        ks = parse_k(ks)
        counts = sorted({k_count(k, len(ranking.heads)) for k in ks})
        table = bootstrap_heads(scored, counts, n_boot=n_boot, seed=boot_seed)
        ranking.heads = mark_kv(table, group) if granularity == "kv" else table
        uncertainty = {"k": ks, "counts": counts, "n_boot": n_boot, "seed": boot_seed}
    message = few_samples(len(records))
    if message and (run is None or run.dist.main):
        warn(message)  # below the size tests/test_calibration.py checks the intervals at
    if run is None or not run.dist.main:
        if run is not None:
            run.finish()
        return ranking
    run.table(ranking.ram, "ram.parquet")
    run.table(ranking.heads, "heads.csv")
    from corelens.report.heatmap import head_heatmap

    kv_title = f", KV heads: {kv_rule} of {group} query heads" if granularity == "kv" else ""
    head_heatmap(
        ranking.heads,
        run.path / "figures" / "heads_mass.png",
        title=f"Mean RAM ({query} queries{kv_title})",
        marked=uncertain_heads(ranking.heads) if uncertainty else None,
    )
    # Overlays and the explorer draw query heads' attention maps: they read the query-head table.
    by_query = ranking.heads if ranking.query_table is None else ranking.query_table
    if overlays > 0:
        from corelens.report.overlay import write_overlays

        ranked = {r["id"] for r in records}
        chosen = [s for s in samples if s.id in ranked][:overlays]
        if progress:  # a figure of heads x pictures: seconds without another line
            print(f"drawing the attention overlays of {len(chosen)} sample(s)", flush=True)
        write_overlays(m, chosen, by_query, run.path / "figures", query=query)
    if explorer > 0:
        _explorer(m, samples, records, by_query, run, explorer, query)
    if uncertainty:
        run.manifest["uncertainty"] = uncertainty
    run.manifest["granularity"] = {
        "granularity": granularity,
        "kv_rule": kv_rule if granularity == "kv" else None,
        "query_heads_per_kv_head": group,
        "ranked_heads": len(ranking.heads),
    }
    run.finish(samples=len(records), skipped=sum(1 for r in logged if r["status"] == "skipped"))
    return ranking


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
