"""Parsing a command line imports no torch, transformers, pandas or scipy: `--help` and argument errors answer at once.

One subprocess (a fresh interpreter, whose sys.modules starts clean) parses an unknown flag and `--help` for
every command and reports what got imported; times are measured by benchmarks/cli_startup.py, not here.
"""

from __future__ import annotations

import json
import subprocess
import sys

from corelens.commands import COMMANDS

HEAVY = ("torch", "transformers", "pandas", "scipy")  # pandas and scipy: seconds on a loaded machine

PROBE = """
import contextlib, io, json, sys
from corelens.cli import parser
from corelens.commands import COMMANDS
found = {}
for command in COMMANDS:
    for flag in ("--bogus", "--help"):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            try:
                parser(lazy=True).parse_args([command, flag])
                code = 0
            except SystemExit as stop:
                code = stop.code
        found[f"{command} {flag}"] = {
            "code": code,
            "heavy": [m for m in %r if m in sys.modules],
            "said": err.getvalue()[-200:],
        }
print(json.dumps(found))
"""


def test_parsing_any_command_imports_neither_torch_nor_transformers():
    done = subprocess.run(
        [sys.executable, "-c", PROBE % (HEAVY,)], capture_output=True, text=True, check=True, timeout=120
    )
    found = json.loads(done.stdout)
    assert set(found) == {f"{c} {f}" for c in COMMANDS for f in ("--bogus", "--help")}
    for case, seen in found.items():
        assert seen["heavy"] == [], case  # imported while parsing: move the import into the command's run
        # refused by argparse (exit 2: the flag, or a missing sub-command of bench / data / organism), or help
        assert seen["code"] == (2 if case.endswith("--bogus") else 0), (case, seen)


def test_the_command_list_shows_the_help_each_command_registers():
    """`corelens --help` reads each command's help from its module's source, unimported; several commands
    share `commands/experiment_commands.py`, so each must find its own: the one its parser registers with."""
    import argparse

    from corelens.cli import _summary
    from corelens.commands import load_command

    class Recorder:  # what register(sub) receives: records the help, hands back a parser for the options
        helps: dict[str, str | None] = {}

        def add_parser(self, name: str, *, help: str | None = None, **kwargs) -> argparse.ArgumentParser:  # noqa: A002
            self.helps[name] = help
            return argparse.ArgumentParser(prog=name)

    recorder = Recorder()
    for name in COMMANDS:
        load_command(name).register(recorder)
    assert set(recorder.helps) == set(COMMANDS)  # each registers its own parser, under its own name
    assert {name: _summary(name) for name in COMMANDS} == recorder.helps
    assert None not in recorder.helps.values()
