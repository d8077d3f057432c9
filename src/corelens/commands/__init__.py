"""CLI commands: `COMMANDS` maps each command to where it lives, imported only when it is parsed or its help shown.

An experiment command (rank, stability, ablate, hybrid, frontier, importance, flow, sap) is its entry in the
experiment registry (`corelens.experiment_registry`): the generic driver of `options.py` specialised with it,
so a new experiment adds no line here. Any other command is either a module of its own, named after it
(`bench`, `organism`, `report`, `data`, `export`), with `register(subparsers)` adding its parser, or, written
`module:name`, the `Command` (run, register) called `name` in a module that holds several (`demo`, in
`experiment_commands`, beside the experiments' printers): no command module imports the experiment module of
its own name (tests/test_layers.py: no import where one name stands for two modules).

A command's parser sets `func`, called with the parsed arguments; it only parses and calls an experiment.
"""

from __future__ import annotations

from importlib import import_module

from corelens.experiment_registry import Experiment, experiments

# command -> `module` (of corelens.commands) or `module:name`, or a registered experiment's entry (its command is
# built from it: `load_command`), in the order `corelens --help` lists them: the demo and the workflow's
# experiments (WORKFLOW), then the other studies and the tools.
COMMANDS: dict[str, str | Experiment] = {
    "demo": "experiment_commands:demo",
    **{e.name: e for e in experiments("workflow")},
    "export": "export",
    "report": "report",
    **{e.name: e for e in experiments("study")},
    "data": "data",
    "organism": "organism",
    "bench": "bench",
}

# The one-line workflow `corelens --help` shows.
WORKFLOW = (
    "workflow: rank (find the heads) -> stability (do tasks share them) -> ablate / hybrid (test and use them) "
    "-> frontier (compare rankings) -> export (publish them) -> report (one HTML page); `corelens demo` runs "
    "it on the bundled model"
)

# One example per command, shown at the end of its help (`corelens COMMAND --help`); the paths are the
# README tour's (M=src/corelens/organism/checkpoint). An experiment's is in its registry entry.
EXAMPLES = {
    "demo": "corelens demo --out runs/demo",
    **{e.name: e.example for e in experiments()},
    "export": "corelens export runs/rank --out runs/headset --n-heads 10% --to duo,sparsemm",
    "report": "corelens report runs/rank runs/ablate runs/hybrid --out runs/report.html",
    "data": "corelens data stats data/eval/document.jsonl",
    "organism": "corelens organism eval --n 16",
    "bench": "corelens bench ram --tokens 8192",
}


def module_of(command: str) -> str:
    """Return the dotted name of the module that holds `command` (an experiment's: the generic driver's)."""
    where = COMMANDS[command]
    return f"corelens.commands.{'options' if isinstance(where, Experiment) else where.partition(':')[0]}"


def load_command(name: str):
    """Import and return command `name`'s module or `Command`: what has its `register(subparsers)`."""
    where = COMMANDS[name]
    if isinstance(where, Experiment):
        from corelens.commands.options import experiment_command

        return experiment_command(where)
    module, _, attribute = where.partition(":")
    found = import_module(f"corelens.commands.{module}")
    return getattr(found, attribute) if attribute else found
