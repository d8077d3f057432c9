"""What each experiment writes into its run folder, declared once, and the one tail that writes it.

Every run folder holds the manifest (`MANIFEST`) and the per-sample log (`LOG`); each experiment adds its
tables and figures. `Outputs` names them (table key -> file name, figure key -> path), `OUTPUTS` holds the
declaration of every command (each made in its entry of the experiment registry, corelens.experiment_registry),
and the report reads a run folder through it (`OUTPUTS[command].summary_file`)
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
from pathlib import Path

from corelens.experiment_registry import FIGURES, Outputs, experiments
from corelens.runs.driver import LENGTHS  # prompt lengths measured once to balance the ranks
from corelens.runs.rundir import LOG, MANIFEST, Run, write_json

# Every experiment's declared outputs, by command, in the order the experiments register (corelens.experiment_registry,
# where each is declared with its command); a constant per experiment for the modules that write or read one.
OUTPUTS: dict[str, Outputs] = {e.name: e.outputs for e in experiments()}
RANK, STABILITY, ABLATE, HYBRID = (OUTPUTS[c] for c in ("rank", "stability", "ablate", "hybrid"))
FRONTIER, IMPORTANCE, FLOW, SAP = (OUTPUTS[c] for c in ("frontier", "importance", "flow", "sap"))


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
