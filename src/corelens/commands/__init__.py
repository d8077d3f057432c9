"""CLI commands: `COMMANDS` maps each command to where it lives, imported only when it is parsed or its help shown.

A command is either a module of its own, named after it (`bench`, `organism`, `report`, `data`, `export`),
with `register(subparsers)` adding its parser, or, written `module:name`, the `Command` (run, register)
called `name` in a module that holds several: `experiment_commands` holds every command that runs one
experiment (rank, ablate, importance, demo, flow, sap, hybrid, frontier, stability), each the generic driver of
`options.py` specialised; a new experiment's command joins it, so that no command module imports the
experiment module of its own name (tests/test_layers.py: no import where one name stands for two modules).

A command's parser sets `func`, called with the parsed arguments; it only parses and calls an experiment.
"""

from __future__ import annotations

from importlib import import_module

# command -> `module` (of corelens.commands) or `module:name`, in the order `corelens --help` lists them: the
# workflow's order (WORKFLOW), then the other studies and the tools.
COMMANDS = {
    "demo": "experiment_commands:demo",
    "rank": "experiment_commands:rank",
    "stability": "experiment_commands:stability",
    "ablate": "experiment_commands:ablate",
    "hybrid": "experiment_commands:hybrid",
    "frontier": "experiment_commands:frontier",
    "importance": "experiment_commands:importance",
    "export": "export",
    "report": "report",
    "flow": "experiment_commands:flow",
    "sap": "experiment_commands:sap",
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
# README tour's (M=src/corelens/organism/checkpoint).
EXAMPLES = {
    "demo": "corelens demo --out runs/demo",
    "rank": "corelens rank --model $M --data data/rank/document.jsonl --out runs/rank",
    "stability": "corelens stability runs/demo/rank-image runs/demo/rank-video --out runs/stability",
    "ablate": "corelens ablate --model $M --data data/eval/document.jsonl --heads runs/rank/heads.csv "
    "--out runs/ablate --n-heads 3,5 --draws 2",
    "hybrid": "corelens hybrid --model $M --data data/eval/document.jsonl --heads runs/rank/heads.csv "
    "--out runs/hybrid --n-heads 8 --sink 4 --window 16",
    "frontier": "corelens frontier --model $M --data data/eval/document.jsonl --heads runs/rank/heads.csv "
    "--out runs/frontier --budgets 1,3,8 --sink 4 --window 16 --draws 2",
    "importance": "corelens importance --model $M --data data/eval/document.jsonl --heads runs/rank/heads.csv "
    "--out runs/importance --limit 8",
    "export": "corelens export runs/rank --out runs/headset --n-heads 10% --to duo,sparsemm",
    "report": "corelens report runs/rank runs/ablate runs/hybrid --out runs/report.html",
    "flow": "corelens flow --model $M --data data/eval/document.jsonl --out runs/flow --limit 8",
    "sap": "corelens sap --model $M --data data/eval/document.jsonl --out runs/sap --limit 8",
    "data": "corelens data stats data/eval/document.jsonl",
    "organism": "corelens organism eval --n 16",
    "bench": "corelens bench ram --tokens 8192",
}


def module_of(command: str) -> str:
    """Return the dotted name of the module that holds `command`."""
    return f"corelens.commands.{COMMANDS[command].partition(':')[0]}"


def load_command(name: str):
    """Import and return command `name`'s module or `Command`: what has its `register(subparsers)`."""
    module, _, attribute = COMMANDS[name].partition(":")
    found = import_module(f"corelens.commands.{module}")
    return getattr(found, attribute) if attribute else found
