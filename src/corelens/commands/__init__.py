"""CLI commands: `COMMANDS` maps each command to where it lives, imported only when it is parsed or its help shown.

A command is either a module of its own, named after it (`bench`, `organism`, `report`, `data`, `export`),
with `register(subparsers)` adding its parser, or, written `module:name`, the `Command` (run, register)
called `name` in a module that holds several: `experiment_commands` holds every command that runs one
experiment (rank, ablate, importance, demo, flow, sap, hybrid, stability), each the generic driver of
`options.py` specialised; a new experiment's command joins it, so that no command module imports the
experiment module of its own name (tests/test_layers.py: no import where one name stands for two modules).

A command's parser sets `func`, called with the parsed arguments; it only parses and calls an experiment.
"""

from __future__ import annotations

from importlib import import_module

# command -> `module` (of corelens.commands) or `module:name`, in the order `corelens --help` lists them
COMMANDS = {
    "rank": "experiment_commands:rank",
    "ablate": "experiment_commands:ablate",
    "importance": "experiment_commands:importance",
    "demo": "experiment_commands:demo",
    "bench": "bench",
    "flow": "experiment_commands:flow",
    "sap": "experiment_commands:sap",
    "organism": "organism",
    "hybrid": "experiment_commands:hybrid",
    "stability": "experiment_commands:stability",
    "report": "report",
    "data": "data",
    "export": "export",
}


def module_of(command: str) -> str:
    """Return the dotted name of the module that holds `command`."""
    return f"corelens.commands.{COMMANDS[command].partition(':')[0]}"


def load_command(name: str):
    """Import and return command `name`'s module or `Command`: what has its `register(subparsers)`."""
    module, _, attribute = COMMANDS[name].partition(":")
    found = import_module(f"corelens.commands.{module}")
    return getattr(found, attribute) if attribute else found
