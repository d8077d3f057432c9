"""Cross-task (or cross-model) stability of rank runs: rank runs -> statistics tables + figures in a run dir.

Writes `spearman.csv` (pairs with bootstrap 95 % intervals), `jaccard.csv`, `universal.csv`,
`core_set.csv` (rank aggregation over runs), `topology.csv` (sparsity per run), `depth.csv` (depth
profile per run) and figures (Spearman matrix, depth profiles, one heatmap per run).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from corelens.errors import CorelensError, warn
from corelens.metrics.headsets import k_count, parse_k
from corelens.metrics.posterior import SPEARMAN_CALIBRATED_FROM, few_samples
from corelens.metrics.ram import RANKED, read_ram
from corelens.metrics.rank_agreement import (
    aggregate_ranking,
    head_tables,
    jaccard_pairs,
    spearman_pairs,
    universal_heads,
)
from corelens.metrics.topology import depth_profile, sparsity
from corelens.metrics.uncertainty import first_n, stability_curve
from corelens.runs import MANIFEST, Run, file_hash, write_json
from corelens.runs.files import write_text
from corelens.runs.outputs import RANK, STABILITY, conclude


@dataclass
class Stability:
    """The stability tables of a set of rank runs."""

    labels: list[str]
    spearman: pd.DataFrame
    jaccard: pd.DataFrame
    universal: list[tuple[int, int]]
    core_set: pd.DataFrame
    topology: pd.DataFrame
    depth: pd.DataFrame


def read_rank_run(path: str | Path) -> tuple[pd.DataFrame, dict]:
    """Return the long RAM table and the manifest of a finished `corelens rank` run directory."""
    path = Path(path)
    table, manifest = RANK.path(path, "ram"), path / MANIFEST
    for needed in (table, manifest):
        if not needed.is_file():
            raise CorelensError(f"{path} is not a finished rank run: {needed.name} is missing")
    info = json.loads(manifest.read_text())
    if info.get("command") != "rank":
        raise CorelensError(f"{path} holds a {info.get('command')!r} run, not a rank run")
    return read_ram(table, ("sample_id", "task", *RANKED[1:]), all_columns=True), info


def run_labels(paths: list[Path], rams: list[pd.DataFrame]) -> list[str]:
    """Return one label per run: its task when each run holds one distinct task, else its folder name."""
    tasks = [sorted(ram["task"].dropna().unique()) for ram in rams]
    if all(len(t) == 1 for t in tasks) and len({t[0] for t in tasks}) == len(tasks):
        return [t[0] for t in tasks]
    names = [p.name for p in paths]
    if len(set(names)) == len(names):
        return names
    return [str(p) for p in paths]


def compute_stability(
    rams: dict[str, pd.DataFrame], *, k: str | int | float = "5%", n_boot: int = 1000, seed: int = 0
) -> Stability:
    """Return the stability statistics of labelled long RAM tables (docs/methods.md#cross-task-stability); `k` as in `k_count`."""
    tables = head_tables(rams)
    k = k_count(k, len(next(iter(tables.values()))))
    layers = max(int(t["layer"].max()) + 1 for t in tables.values())
    topology = pd.DataFrame([{"run": label, **sparsity(t)} for label, t in tables.items()])
    depth = pd.concat(
        [depth_profile(t, k, layers).assign(run=label) for label, t in tables.items()], ignore_index=True
    )
    return Stability(
        labels=list(rams),
        spearman=spearman_pairs(rams, n_boot=n_boot, seed=seed),
        jaccard=jaccard_pairs(tables, k),
        universal=universal_heads(tables, k),
        core_set=aggregate_ranking(tables),
        topology=topology,
        depth=depth,
    )


def stability(
    runs: list[str | Path],
    out: str | Path,
    *,
    k: str | int | float = "5%",
    n_boot: int = 1000,
    seed: int = 0,
    argv: list[str] | None = None,
) -> Stability:
    """Compare rank runs (different tasks or models) and write the stability run directory `out`."""
    if len(runs) < 2:
        raise CorelensError("stability needs at least two rank runs")
    paths = [Path(r) for r in runs]
    loaded = [read_rank_run(p) for p in paths]
    rams = [ram for ram, _ in loaded]
    labels = run_labels(paths, rams)
    settings = {
        "runs": [str(p.resolve()) for p in paths],
        "ram_sha256": [file_hash(RANK.path(p, "ram")) for p in paths],
        "k": k,
        "n_boot": n_boot,
        "seed": seed,
    }
    run = Run(out, "stability", settings, argv)
    result = compute_stability(dict(zip(labels, rams)), k=k, n_boot=n_boot, seed=seed)
    fewest = min(ram["sample_id"].nunique() for ram in rams)
    message = few_samples(fewest, "smallest run compared", "Spearman intervals", SPEARMAN_CALIBRATED_FROM)
    if message:
        warn(message)  # below the size tests/test_calibration.py checks the Spearman interval at

    def draw(paths: dict[str, Path]) -> None:
        from corelens.report.run_comparison import depth_figure, spearman_figure

        spearman_figure(result.spearman, result.labels, paths["spearman_matrix"])
        depth_figure(result.depth, paths["depth_profile"])

    tables = {
        "spearman": result.spearman,
        "jaccard": result.jaccard,
        "universal": pd.DataFrame(result.universal, columns=["layer", "head"]),
        "core_set": result.core_set,
        "topology": result.topology,
        "depth": result.depth,
    }
    conclude(run, STABILITY, tables, draw=draw, labels=labels, universal=len(result.universal))
    return result


CURVE = Path(STABILITY.file("curve_info")).stem  # stability_curve: its .csv, .json and figure


def curve_summary(curve: pd.DataFrame, at: float = 0.9) -> dict[str, int | None]:
    """Return, per k, the smallest n from which the top-k Jaccard stays >= `at`, and the same for Spearman."""
    out: dict[str, int | None] = {
        f"jaccard_top{k}": first_n(curve, k, at=at) for k in sorted(curve["k"].unique())
    }
    out["spearman"] = first_n(curve, int(curve["k"].iloc[0]), "spearman", at)
    return out


def curve_of_run(
    path: str | Path, *, k: str = "5%", pairs: int = 200, seed: int = 0, argv: list[str] | None = None
) -> tuple[pd.DataFrame, dict]:
    """Write the stability curve of a rank run into that run (`stability_curve.csv`, `.json`, figure)."""
    path = Path(path)
    ram, _ = read_rank_run(path)
    heads = ram.groupby(["layer", "head"]).ngroups
    counts = sorted({k_count(item, heads) for item in parse_k(k)})
    curve = stability_curve(ram, counts, pairs=pairs, seed=seed)
    summary = curve_summary(curve)
    write_text(STABILITY.path(path, "curve_table"), curve.to_csv(index=False), root=path)
    info = {
        "k": k,
        "counts": counts,
        "pairs": pairs,
        "seed": seed,
        "samples": int(ram["sample_id"].nunique()),
        "ram_sha256": file_hash(RANK.path(path, "ram")),
        "first_n_at_0.9": summary,
        "argv": argv,
    }
    write_json(STABILITY.path(path, "curve_info"), info, root=path)
    from corelens.report.curves import curve_figure

    curve_figure(curve, STABILITY.path(path, "curve"), title=f"{path.name}: {info['samples']} samples")
    return curve, info


def run_command(config, ctx, load_options: dict) -> Stability | dict:
    """`corelens stability`: compare the config's (`StabilityConfig`) rank runs into `ctx.out`, or with
    `curve`, write that run's stability curve into it (returns the curve's information)."""
    if config.curve:
        if config.runs:
            raise CorelensError("--curve takes one rank run; give no other run directories")
        return curve_of_run(config.curve, k=config.k, pairs=config.pairs, seed=config.seed, argv=ctx.argv)[1]
    if ctx.out is None:
        raise CorelensError("--out is required to compare rank runs")
    return stability(config.runs, ctx.out, k=config.k, n_boot=config.n_boot, seed=config.seed, argv=ctx.argv)
