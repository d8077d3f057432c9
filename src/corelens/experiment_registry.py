"""The experiment registry: each experiment command declared once, in a module that imports no library.

One `Experiment` per command: its name, its one-line help and where `corelens --help` lists it, its config,
its entry point and what it prints (each "module:name", imported only when the command is parsed or run), its
example command line and its declared `Outputs`. The tables that were kept by hand are read from here:
`corelens.runs.outputs.OUTPUTS` (the outputs by command), the experiment commands of
`corelens.commands.COMMANDS` and their `EXAMPLES` (each command the generic driver of
`corelens.commands.options` specialised with its entry), and the lists of tests/test_shape.py. A new
experiment is its entry here, its module and its test (docs/extending/experiment.md).

Examples:
    >>> from corelens.experiment_registry import EXPERIMENTS, experiments
    >>> EXPERIMENTS["rank"].outputs.summary_file
    'heads.csv'
    >>> [e.name for e in experiments("study")]
    ['flow', 'sap']
    >>> EXPERIMENTS["tokenz"]
    Traceback (most recent call last):
    ...
    corelens.errors.OptionError: unknown experiment 'tokenz'; known: ablate, flow, frontier, hybrid, importance, rank, sap, stability
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from corelens.errors import OptionError
from corelens.registry import Registry

FIGURES = "figures"  # the folder of a run's figures
# Where `corelens --help` lists an experiment: after `demo` in the workflow's order, or after `export` and
# `report` with the other studies (the tools follow).
LISTED = ("workflow", "study")


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


def figure(name: str) -> str:
    """Return the path of figure file `name` in a run folder."""
    return f"{FIGURES}/{name}"


@dataclass(frozen=True)
class Experiment:
    """One experiment command: `name`, its `help` line, its `config` ("module:Class", the dataclass its options
    are made from: a module that imports no torch), `run` ("module:function", called as
    `run(config, ctx, load_options)`), `show` ("module:function", `show(result, config)` prints the result
    on the main process), its `example` command line, its `outputs` and where `--help` lists it (`LISTED`)."""

    name: str
    help: str
    config: str
    run: str
    show: str
    example: str
    outputs: Outputs
    listed: str = "workflow"

    def __post_init__(self) -> None:
        if self.outputs.command != self.name:
            raise OptionError(f"experiment {self.name!r} declares the outputs of {self.outputs.command!r}")
        if self.listed not in LISTED:
            raise OptionError(f"experiment {self.name!r}: listed {self.listed!r}; expected one of {LISTED}")


class Experiments(Registry):
    """name -> `Experiment`, in the order they register (the order `corelens --help` lists them)."""

    kind = "experiment"

    @staticmethod
    def name_of(impl: Experiment) -> str:
        return impl.name

    @classmethod
    def _add(cls, name: str, impl: Experiment) -> Experiment:
        if cls._global_mapping.get(name, impl) != impl:  # one command, one declaration
            raise OptionError(f"experiment {name!r} is registered already")
        return super()._add(name, impl)

    @classmethod
    def in_order(cls, listed: str | None = None) -> tuple[Experiment, ...]:
        """Return the registered experiments in registration order (only those `listed` there, if given)."""
        return tuple(e for e in cls._global_mapping.values() if listed in (None, e.listed))


register = Experiments.register
experiments = Experiments.in_order
EXPERIMENTS = Experiments()

CONFIGS = "corelens.experiments.configs"
SWEEPS = "corelens.experiments.sweep"
SHOW = "corelens.commands.experiment_commands"  # the printers of the experiments registered here
MODEL = "--model $M"  # the examples' model: the README tour's (M=src/corelens/organism/checkpoint)
EVAL = f"{MODEL} --data data/eval/document.jsonl"
RANKED = f"{EVAL} --heads runs/rank/heads.csv"


def sweep_outputs(command: str, table: str, plot: str, sets: dict[str, str]) -> Outputs:
    """The outputs of a head-set sweep (ablate, hybrid): records, the per-condition table, its per-(set, k)
    summary, the summary over ranking resamples, one figure and the sets swept."""
    tables = {"records": "records.parquet", "table": f"{table}.csv", "summary": f"{table}_summary.csv"}
    figures = {plot: figure(f"{plot}.png")}
    return Outputs(command, {**tables, "resampled": "resampled.csv"}, figures, sets, summary="table")


register(
    Experiment(
        "rank",
        "rank heads by Retrieval Attention Mass",
        f"{CONFIGS}:RankConfig",
        "corelens.experiments.rank:run_command",
        f"{SHOW}:show_rank",
        f"corelens rank {MODEL} --data data/rank/document.jsonl --out runs/rank",
        Outputs(
            "rank",
            {"ram": "ram.parquet", "heads": "heads.csv"},
            {"heads_mass": figure("heads_mass.png")},
            {"explorer": "explorer.json"},
            summary="heads",
        ),
    )
)
register(
    Experiment(
        "stability",
        "cross-task / cross-model stability of rank runs",
        f"{CONFIGS}:StabilityConfig",
        "corelens.experiments.stability:run_command",
        f"{SHOW}:show_stability",
        "corelens stability runs/demo/rank-image runs/demo/rank-video --out runs/stability",
        Outputs(
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
                "spearman_matrix": figure("spearman.png"),
                "depth_profile": figure("depth.png"),
                "curve": figure("stability_curve.png"),
            },
            {"curve_info": "stability_curve.json", "curve_table": "stability_curve.csv"},
            summary="spearman",
        ),
    )
)
register(
    Experiment(
        "ablate",
        "ablate top / bottom / random head sets and measure accuracy",
        f"{SWEEPS}:AblateConfig",
        "corelens.experiments.ablate:run_command",
        f"{SHOW}:show_ablate",
        f"corelens ablate {RANKED} --out runs/ablate --n-heads 3,5 --draws 2",
        sweep_outputs("ablate", "ablation", "dose_response", {"sets": "headsets.json", "means": "means.npz"}),
    )
)
register(
    Experiment(
        "hybrid",
        "accuracy vs heads kept full under hybrid (full + streaming) attention",
        f"{SWEEPS}:HybridConfig",
        "corelens.experiments.hybrid:run_command",
        f"{SHOW}:show_hybrid",
        f"corelens hybrid {RANKED} --out runs/hybrid --n-heads 8 --sink 4 --window 16",
        sweep_outputs("hybrid", "hybrid", "hybrid", {"sets": "policies.json"}),
    )
)
register(
    Experiment(
        "frontier",
        "compare head rankings on one accuracy / KV-cache frontier (hybrid and ablation at each budget)",
        f"{SWEEPS}:FrontierConfig",
        "corelens.experiments.frontier:run_command",
        f"{SHOW}:show_frontier",
        f"corelens frontier {RANKED} --out runs/frontier --budgets 1,3,8 --sink 4 --window 16 --draws 2",
        Outputs(
            "frontier",
            {"table": "frontier.csv", "budgets": "frontier_budgets.csv", "rankings": "rankings.csv"},
            {"frontier": figure("frontier.png")},
            {
                "methods": "methods"
            },  # each method's hybrid and ablate run folders, methods/<label>/<granularity>/
            summary="budgets",
        ),
    )
)
register(
    Experiment(
        "importance",
        "measure each head's causal effect on the answer beside its RAM",
        f"{CONFIGS}:ImportanceConfig",
        "corelens.experiments.importance:run_command",
        f"{SHOW}:show_importance",
        f"corelens importance {RANKED} --out runs/importance --limit 8",
        Outputs(
            "importance",
            {"records": "records.parquet", "table": "importance.csv", "summary": "summary.json"},
            {"ram_vs_causal": figure("ram_vs_causal.png")},
            summary="table",
        ),
    )
)
register(
    Experiment(
        "flow",
        "RID / MixIG of every attention and FFN module: docs/methods.md#geometry",
        f"{CONFIGS}:FlowConfig",
        "corelens.experiments.flow:run_command",
        f"{SHOW}:show_flow",
        f"corelens flow {EVAL} --out runs/flow --limit 8",
        Outputs(
            "flow",
            {"frame": "flow.parquet", "table": "table1.csv", "layers": "layers.csv"},
            {"flow_layers": figure("flow_layers.png")},
            summary="table",
        ),
        listed="study",
    )
)
register(
    Experiment(
        "sap",
        "accuracy with attention priors in place of learned visual attention",
        f"{CONFIGS}:SapConfig",
        "corelens.experiments.sap:run_command",
        f"{SHOW}:show_sap",
        f"corelens sap {EVAL} --out runs/sap --limit 8",
        Outputs(
            "sap",
            {
                "frame": "sap.parquet",
                "accuracy": "accuracy.csv",
                "key_region": "key_region.csv",
                "priors": "priors.csv",
            },
            {"sap_accuracy": figure("sap_accuracy.png")},
            summary="accuracy",
        ),
        listed="study",
    )
)
