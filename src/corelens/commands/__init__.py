"""CLI commands: one module per command, each with `register(subparsers)` adding its parser.

A command's parser sets `func`, called with the parsed arguments; it only parses and calls an experiment.
"""

COMMANDS = (
    "rank",
    "ablate",
    "importance",
    "demo",
    "bench",
    "flow",
    "sap",
    "organism",
    "hybrid",
    "stability",
    "report",
    "data",
    "export",
)
