"""What each experiment writes into its run folder, declared once, and the one tail that writes it.

Every run folder holds the manifest (`MANIFEST`) and the per-sample log (`LOG`); each experiment adds its
tables and figures. `Outputs` names them (table key -> file name, figure key -> path), `OUTPUTS` holds the
declaration of every command, and the report reads a run folder through it (`OUTPUTS[command].summary_file`)
instead of knowing each experiment's file names. `conclude` is the experiment tail: on the main process it
records the manifest's extra entries, writes the tables (a `.parquet` / `.csv` through `Run.table`, a `.json`
through `write_json`), draws the figures and finishes the run; on another rank it only finishes (a collective).

Examples:
    >>> import pandas as pd
    >>> from corelens.runs import Run
    >>> from corelens.runs.outputs import OUTPUTS, conclude
    >>> folder = getfixture("tmp_path") / "run"
    >>> run = Run(folder, "stability", {})
    >>> frame = pd.DataFrame({"n": [1]})
    >>> tables = dict.fromkeys(("spearman", "jaccard", "universal", "core_set", "topology", "depth"), frame)
    >>> conclude(run, OUTPUTS["stability"], tables)
    >>> sorted(p.name for p in folder.glob("*.csv"))
    ['core_set.csv', 'depth.csv', 'jaccard.csv', 'spearman.csv', 'topology.csv', 'universal.csv']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from corelens.runs.driver import LENGTHS  # prompt lengths measured once to balance the ranks
from corelens.runs.rundir import LOG, MANIFEST, Run, write_json

FIGURES = "figures"  # the folder of a run's figures


@dataclass(frozen=True)
class Outputs:
    """The files one experiment writes: `tables` (key -> file name, written in this order), `figures`
    (key -> path under the run folder), `files` (key -> other files it writes itself, e.g. during the run),
    and `summary`, the table key the report's finding is read from."""

    command: str
    tables: Mapping[str, str]
    figures: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    summary: str | None = None

    def __post_init__(self) -> None:
        keys = [*self.tables, *self.figures, *self.files]
        if len(keys) != len(set(keys)):  # `file(key)` must name one file
            raise ValueError(f"{self.command}: an output key is declared twice in {keys}")

    def file(self, key: str) -> str:
        """Return the file name of table, figure or file `key` (keys are unique across the three)."""
        for names in (self.tables, self.figures, self.files):
            if key in names:
                return names[key]
        raise KeyError(f"{self.command} declares no output {key!r}")

    def path(self, run: str | Path, key: str) -> Path:
        """Return where output `key` is in run folder `run`."""
        return Path(run) / self.file(key)

    @property
    def summary_file(self) -> str | None:
        """The file name of the report's summary table (None: the report shows no finding)."""
        return self.file(self.summary) if self.summary else None


def _figure(name: str) -> str:
    return f"{FIGURES}/{name}"


RANK = Outputs(
    "rank",
    {"ram": "ram.parquet", "heads": "heads.csv"},
    {"heads_mass": _figure("heads_mass.png")},
    {"explorer": "explorer.json"},
    summary="heads",
)


def _sweep(command: str, table: str, figure: str, sets: dict[str, str]) -> Outputs:
    """The outputs of a head-set sweep (ablate, hybrid): records, the per-condition table, its per-(set, k)
    summary, the summary over ranking resamples, one figure and the sets swept."""
    tables = {"records": "records.parquet", "table": f"{table}.csv", "summary": f"{table}_summary.csv"}
    figures = {figure: _figure(f"{figure}.png")}
    return Outputs(command, {**tables, "resampled": "resampled.csv"}, figures, sets, summary="table")


ABLATE = _sweep("ablate", "ablation", "dose_response", {"sets": "headsets.json", "means": "means.npz"})
HYBRID = _sweep("hybrid", "hybrid", "hybrid", {"sets": "policies.json"})
SAP = Outputs(
    "sap",
    {
        "frame": "sap.parquet",
        "accuracy": "accuracy.csv",
        "key_region": "key_region.csv",
        "priors": "priors.csv",
    },
    {"sap_accuracy": _figure("sap_accuracy.png")},
    summary="accuracy",
)
FLOW = Outputs(
    "flow",
    {"frame": "flow.parquet", "table": "table1.csv", "layers": "layers.csv"},
    {"flow_layers": _figure("flow_layers.png")},
    summary="table",
)
IMPORTANCE = Outputs(
    "importance",
    {"records": "records.parquet", "table": "importance.csv", "summary": "summary.json"},
    {"ram_vs_causal": _figure("ram_vs_causal.png")},
    summary="table",
)
STABILITY = Outputs(
    "stability",
    {
        "spearman": "spearman.csv",
        "jaccard": "jaccard.csv",
        "universal": "universal.csv",
        "core_set": "core_set.csv",
        "topology": "topology.csv",
        "depth": "depth.csv",
    },
    {
        "spearman_matrix": _figure("spearman.png"),
        "depth_profile": _figure("depth.png"),
        "curve": _figure("stability_curve.png"),
    },
    {"curve_info": "stability_curve.json", "curve_table": "stability_curve.csv"},
    summary="spearman",
)

FRONTIER = Outputs(
    "frontier",
    {"table": "frontier.csv", "budgets": "frontier_budgets.csv", "rankings": "rankings.csv"},
    {"frontier": _figure("frontier.png")},
    {"methods": "methods"},  # each method's hybrid and ablate run folders, methods/<label>/<granularity>/
    summary="budgets",
)

OUTPUTS: dict[str, Outputs] = {
    o.command: o for o in (RANK, STABILITY, ABLATE, HYBRID, FRONTIER, FLOW, SAP, IMPORTANCE)
}
"""Every experiment's declared outputs, by command, in the order the report lists its findings."""


def conclude(
    run: Run | None,
    outputs: Outputs,
    tables: Mapping[str, object],
    *,
    draw: Callable[[dict[str, Path]], None] | None = None,
    manifest: Mapping[str, object] | None = None,
    **finish: object,
) -> None:
    """Write an experiment's results into `run` and finish it; nothing when `run` is None.

    `tables` maps declared table keys to their frames (or, for a `.json` table, to a JSON value); a None
    table (e.g. no resampled summary) is not written. `draw(paths)` draws the figures into `paths` (figure
    key -> path); `manifest` entries are recorded before the run finishes with `finish` (samples, skipped...).
    """
    if run is None:
        return
    if not run.dist.main:
        run.finish()  # a collective: the other ranks wait here while rank 0 writes
        return
    run.manifest.update(manifest or {})
    unknown = set(tables) - set(outputs.tables)
    if unknown:
        raise KeyError(f"{outputs.command} declares no table {', '.join(sorted(unknown))}")
    for key, name in outputs.tables.items():
        value = tables.get(key)
        if value is None:
            continue  # declared but not made by this run (e.g. resampled.csv without --rank-resamples)
        if name.endswith(".json"):
            write_json(run.path / name, value, root=run.path)
        else:
            run.table(value, name)
    if draw is not None:
        draw({key: run.path / name for key, name in outputs.figures.items()})
    run.finish(**finish)


__all__ = ["FIGURES", "LENGTHS", "LOG", "MANIFEST", "OUTPUTS", "Outputs", "conclude"]
