"""Rank heads by Retrieval Attention Mass: samples -> per-head RAM -> ram.parquet, heads.csv, heatmap."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from corelens.attention import RamProbe, activate
from corelens.data.sample import Sample, read_samples
from corelens.errors import InputError
from corelens.metrics.ram import head_table, sample_frame, top_heads
from corelens.models.loaded import Loaded, load
from corelens.models.prepare import prepare
from corelens.runs import Run, model_data_settings


@dataclass
class SampleRam:
    """RAM of one sample: (layers, heads) arrays of mass, visual share and lift, and the set sizes."""

    mass: np.ndarray
    share: np.ndarray
    lift: np.ndarray
    n_omega: int
    n_visual: int


def measure_sample(m: Loaded, sample: Sample, query: str = "question", rule: str = "any") -> SampleRam:
    """Return the RAM of every (layer, query head) for one sample, from a single probed forward."""
    prepared = prepare(m, sample, answer=sample.answer if query == "answer" else None)
    if query == "answer" and sample.answer is None:
        raise InputError(
            "query 'answer' needs an answer", file=sample.source, line=sample.line, sample=sample.id
        )
    omega = prepared.layout.omega(sample.targets, rule, sample=sample.id)
    visual = prepared.layout.visual
    if not len(omega):
        raise InputError(
            "the targets cover no visual token", file=sample.source, line=sample.line, sample=sample.id
        )
    probe = RamProbe(
        m.num_layers,
        m.num_heads,
        torch.from_numpy(prepared.rows(query)),
        torch.from_numpy(omega),
        torch.from_numpy(visual),
        prepared.seq_len,
    )
    inputs = {k: v.to(m.device) if hasattr(v, "to") else v for k, v in prepared.inputs.items()}
    with torch.no_grad(), activate(m.layer_modules(), probe):
        m.model(**inputs, use_cache=False, logits_to_keep=1)
    mass = probe.mass.double().numpy()
    vis = probe.visual_mass.double().numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(vis > 0, mass / vis, np.nan)
    lift = share / (len(omega) / len(visual))
    return SampleRam(mass, share, lift, len(omega), len(visual))


@dataclass
class Ranking:
    """A rank result: the per-sample long table and the per-head table (rank 1 = highest mean mass)."""

    ram: pd.DataFrame
    heads: pd.DataFrame

    def top(self, k: int | float) -> list[tuple[int, int]]:
        """Return the top-k (layer, head) pairs; a float in (0, 1) is a fraction of all heads."""
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
    }


def rank(
    m: Loaded,
    data: str | Path,
    *,
    query: str = "question",
    rule: str = "any",
    limit: int | None = None,
    out: str | Path | None = None,
    skip_bad: bool = False,
    progress: bool = False,
    overlays: int = 0,
    argv: list[str] | None = None,
) -> Ranking:
    """Rank the heads of `m` by RAM over the samples of `data`; with `out`, write a resumable run dir.

    `overlays` > 0 also draws the top and bottom heads' attention on the first `overlays` ranked samples.
    """
    samples, skipped = read_samples(data, skip_bad=skip_bad, limit=limit)
    # RAM needs Ω: samples kept for scoring without an evidence target are skipped with the reason.
    no_target = [s for s in samples if not s.targets]
    samples = [s for s in samples if s.targets]
    if out is None:
        records = [_record(s, measure_sample(m, s, query, rule)) for s in tqdm(samples, disable=not progress)]
        return _ranking(records)
    settings = {
        **model_data_settings(m, data),
        "query": query,
        "rule": rule,
        "limit": limit,
        "skip_bad": skip_bad,
        "seed": 0,
    }
    run = Run(out, "rank", settings, argv)
    done = run.done()
    run.log_skipped(skipped, done)
    for sample in no_target:
        if sample.id not in done:
            reason = "no evidence target: RAM needs Ω"
            run.log({"id": sample.id, "status": "skipped", "line": sample.line, "reason": reason})
    todo = [s for s in samples if s.id not in done]
    for sample in tqdm(todo, desc="rank", unit="sample", disable=not progress):
        try:
            result = measure_sample(m, sample, query, rule)
        except InputError as err:
            if not skip_bad:
                raise
            run.log({"id": sample.id, "status": "skipped", "line": sample.line, "error": str(err)})
            continue
        run.log(_record(sample, result))
    order = {s.id: i for i, s in enumerate(samples)}
    records = sorted(
        (r for r in run.records() if r["status"] == "ok"), key=lambda r: order.get(r["id"], 1 << 30)
    )
    ranking = _ranking(records)
    ranking.ram.to_parquet(run.path / "ram.parquet", index=False)
    ranking.heads.to_csv(run.path / "heads.csv", index=False)
    from corelens.report.heatmap import head_heatmap

    head_heatmap(ranking.heads, run.path / "figures" / "heads_mass.png", title=f"Mean RAM ({query} queries)")
    if overlays > 0:
        from corelens.experiments.overlay import write_overlays

        ranked = {r["id"] for r in records}
        chosen = [s for s in samples if s.id in ranked][:overlays]
        write_overlays(m, chosen, ranking.heads, run.path / "figures", query=query)
    n_skipped = sum(1 for r in run.records() if r["status"] == "skipped")
    run.finish(samples=len(records), skipped=n_skipped)
    return ranking


def _ranking(records: list[dict]) -> Ranking:
    ram = sample_frame(records)
    return Ranking(ram, head_table(ram))


def rank_path(model: str | Path, data: str | Path, out: str | Path, **kwargs) -> Ranking:
    """Load `model` and rank its heads on `data` into run directory `out`."""
    return rank(load(model), data, out=out, **kwargs)
