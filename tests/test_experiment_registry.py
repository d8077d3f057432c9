"""The experiment registry is the one place an experiment is declared: the tables read from it agree with it,
and every experiment module in the source is in it.

`OUTPUTS`, the experiment commands of `COMMANDS` (in `--help`'s order), `EXAMPLES`, the command list's help
lines and tests/test_shape.py's configs are read from `corelens.experiment_registry` (the report's `FINDINGS`
name registered commands only); an experiment module
(a file of src/corelens/experiments defining `run_command`) read from the source, not imported, must be an
entry's `run`, so that dropping an entry fails here rather than removing a command unnoticed.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import test_shape

from corelens.commands import COMMANDS, EXAMPLES, load_command
from corelens.commands.options import named
from corelens.errors import OptionError
from corelens.experiment_registry import EXPERIMENTS, Experiment, Outputs, experiments, register
from corelens.report.summary import FINDINGS
from corelens.runs.outputs import OUTPUTS

EXPERIMENTS_DIR = Path(__file__).resolve().parents[1] / "src" / "corelens" / "experiments"


def experiment_modules() -> set[str]:
    """Return the experiment modules of the source: those that define a module-level `run_command`."""
    found = set()
    for path in EXPERIMENTS_DIR.glob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        if any(isinstance(n, ast.FunctionDef) and n.name == "run_command" for n in tree.body):
            found.add(f"corelens.experiments.{path.stem}")
    return found


def test_every_experiment_module_is_registered():
    assert experiment_modules() == {e.run.partition(":")[0] for e in experiments()}
    assert len(experiments()) == len(EXPERIMENTS) == len(experiment_modules())


def test_the_tables_are_read_from_the_registry():
    assert {e.name: e.outputs for e in experiments()} == OUTPUTS
    assert {n: w for n, w in COMMANDS.items() if isinstance(w, Experiment)} == dict(EXPERIMENTS.items())
    # --help's order: demo, the workflow's experiments, export and report, the studies, then the tools.
    listed = [*(e.name for e in experiments("workflow")), *(e.name for e in experiments("study"))]
    assert [n for n in COMMANDS if n in EXPERIMENTS] == listed
    assert list(COMMANDS).index("report") < list(COMMANDS).index(experiments("study")[0].name)
    assert all(
        EXAMPLES[e.name] == e.example and e.example.startswith(f"corelens {e.name} ") for e in experiments()
    )
    assert set(test_shape.CONFIGS) == set(EXPERIMENTS)
    assert set(FINDINGS) <= set(EXPERIMENTS)  # the report's finding sentences, by registered command


@pytest.mark.parametrize("experiment", experiments(), ids=lambda e: e.name)
def test_an_entry_names_what_exists(experiment):
    """Its config is a dataclass, its run and printer are functions, its command registers under its name."""
    assert dataclasses.is_dataclass(named(experiment.config))
    assert callable(named(experiment.run)) and callable(named(experiment.show))
    command = load_command(experiment.name)
    assert command.register.keywords["name"] == experiment.name
    assert command.register.keywords["help"] == experiment.help


def test_a_second_entry_under_a_name_is_refused():
    rank = EXPERIMENTS["rank"]
    assert register(rank) is rank  # the same declaration again (a reloaded module) replaces itself
    other = dataclasses.replace(rank, help="something else")
    with pytest.raises(OptionError, match="'rank' is registered already"):
        register(other)
    with pytest.raises(OptionError, match="declares the outputs of 'rank'"):
        dataclasses.replace(rank, name="ranked")
    with pytest.raises(OptionError, match="listed 'tools'"):
        dataclasses.replace(rank, listed="tools")
    assert EXPERIMENTS["rank"] is rank and isinstance(rank.outputs, Outputs)
