"""Every option of every command, given a malformed value, stops the command with one clean error line.

The parser is walked (every sub-parser, nested ones too), so a new command or option is covered the day it is
added. Each option's malformed value is derived from its argparse action: an unknown choice, a non-number for a
number, a missing file for an input path, a path under a regular file for an output, a broken list for a comma
list; an option of free text must be named in FREE (a value the command must reject) or SKIP (why none is).

"Clean" means: exit status 2 and standard error holding no traceback, only argparse's usage lines (when the
parser itself refuses the value) and then exactly one error line, `corelens[ SUB...]: error: MESSAGE`, whose
message names the option or quotes the value. Every value must be refused before a model loads (the commands
check their options while parsing, or first thing): the whole test runs in-process in a few seconds.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from corelens.cli import main, parser
from corelens.commands.argtypes import existing_path, output_file, output_path, samples_path
from corelens.organism import organism_path

MISSING = "/nonexistent/corelens-missing"  # an input path that is not there
NOT_A_NUMBER = "x1"
# By option string: the malformed value of an option of structured text (a list with a bad item, a spec that
# does not parse, a hub id or path that is not there); those of free text must be here or in SKIP.
FREE = {
    "--model": MISSING,
    "--heads": MISSING,
    "--keep": "5%,abc",
    "--k": "5%,abc",
    "--sink": "many",
    "--window": "many",
    "--sets": "top,nonsense",
    "--prior": "nonsense",
    "--layers": "nonsense",
    "--to": "nonsense",
    "--options": "{not json",
    "--device": "nonsense",
    "--device-map": "nonsense",
    "--max-memory": "0:70GiB",
    "spec": "nonsense:/nowhere",
}
# Outputs (a folder or file under a regular file cannot be made) not typed `output_path`.
OUTPUTS = {"--out", "--json"}
# Options no value of which is malformed, and why.
SKIP = {
    "--title": "any text is a title",
    "--revision": "any text may name a hub branch, tag or commit; a folder checkpoint ignores it",
    "--offload-folder": "any folder may be made to offload to",
}


def commands(p: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Yield (command path, parser) for every leaf parser under `p`."""
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, p
    for action in subs:
        for name, child in action.choices.items():
            yield from commands(child, (*path, name))


def name(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else action.dest


def malformed(action: argparse.Action, out_file: Path) -> str | None:
    """Return the malformed value of an option taking one, or None for a flag."""
    key = name(action)
    if action.nargs == 0 or isinstance(action, argparse._HelpAction):
        return None  # a flag (--skip-bad, --help) takes no value: there is nothing to malform
    if key in SKIP:
        return None
    if action.choices is not None:
        return "not-a-choice"
    if action.type in (output_path, output_file) or key in OUTPUTS:
        return str(out_file / "sub")
    if action.type in (existing_path, samples_path):
        return MISSING
    if key in FREE:
        return FREE[key]
    if action.type is not None:
        return NOT_A_NUMBER  # int, float and the checked types of lists, counts and shares
    raise AssertionError(f"option {key} of free text: add its malformed value to FREE, or a reason to SKIP")


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> dict[str, list[str]]:
    """Well-formed values of the options a command requires."""
    from corelens.organism.tasks import generate

    root = tmp_path_factory.mktemp("cli")
    data = generate("image", root / "data", n=1)
    heads = root / "heads.csv"
    rows = [f"{i // 8},{i % 8},{1 - i / 32},{i + 1}" for i in range(32)]  # the organism's 4 x 8 heads
    heads.write_text("layer,head,mass,rank\n" + "\n".join(rows) + "\n")
    (root / "run").mkdir()
    (root / "eval.json").write_text("{}")
    return {
        "--model": [str(organism_path())],
        "--data": [str(data)],
        "--heads": [str(heads)],
        "--out": [str(root / "out")],
        "--eval": [str(root / "eval.json")],
        "--tokens": ["64"],
        "runs": [str(root / "run")],
        "run": [str(root / "run")],
        "target": [str(data)],
        "spec": [f"refcocog:{root}"],
    }


def cases():
    """Yield (argv prefix, option, malformed value) for every option of every command."""
    out_file = Path(__file__)  # a regular file: nothing can be made under it
    for path, p in commands(parser()):
        for action in p._actions:
            value = malformed(action, out_file)
            if value is not None:
                yield pytest.param(path, name(action), value, id=" ".join((*path, name(action))))


CASES = list(cases())


def required(p: argparse.ArgumentParser, skip: str, valid: dict[str, list[str]]) -> list[str]:
    """Return argv giving every required option (and required group) but `skip` a well-formed value."""
    argv: list[str] = []
    for action in p._actions:
        key = name(action)
        if action.required and key != skip:
            argv += [key, *valid[key]] if action.option_strings else valid[key]
    for group in p._mutually_exclusive_groups:
        names = [name(a) for a in group._group_actions]
        if group.required and skip not in names:
            key = next(k for k in names if k in valid)
            argv += [key, *valid[key]]
    return argv


def leaf(path: tuple[str, ...]) -> argparse.ArgumentParser:
    return dict(commands(parser()))[path]


ERROR = re.compile(r"^corelens(?: [\w-]+)*: error: (.+)$")


@pytest.mark.parametrize(("path", "option", "value"), CASES)
def test_malformed_value_is_one_clean_error(path, option, value, valid, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    p = leaf(path)
    given = [value] if not option.startswith("-") else [option, value]
    argv = [*path, *required(p, option, valid), *given]
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert code == 2, f"{argv} exited {code}: {err}"
    lines = err.strip().splitlines()
    assert ERROR.match(lines[-1]), err
    assert sum(bool(ERROR.match(line)) for line in lines) == 1, err
    assert all(line.startswith(("usage:", " ")) for line in lines[:-1]), err  # argparse's usage, if any
    message = ERROR.match(lines[-1]).group(1)
    assert option in message or value in message or option.lstrip("-") in message, err


def test_every_command_is_walked() -> None:
    """The walk reaches nested sub-commands (bench's benchmarks, data's and organism's actions)."""
    walked = {path for path, _ in commands(parser())}
    assert {
        ("rank",),
        ("bench", "hybrid"),
        ("bench", "ram"),
        ("data", "convert"),
        ("organism", "train"),
    } <= walked
    assert len(CASES) > 100


def test_python_m_corelens_bench_parses_with_the_main_parser() -> None:
    """From a source tree, `python -m corelens bench WHAT` is the same command, errors included."""
    import os
    import subprocess
    import sys

    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    argv = [sys.executable, "-m", "corelens", "bench", "hybrid", "--tokens", "64", "--repeats", NOT_A_NUMBER]
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert err[-1].startswith("corelens bench hybrid: error: argument --repeats")


def test_bench_hybrid_table_is_an_option(capsys) -> None:
    """`--table FILE...` prints the README table of saved results; it cannot be mixed with --tokens."""

    def bench_hybrid(argv):
        return main(["bench", "hybrid", *argv])

    saved = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "hybrid-4096.json"
    assert bench_hybrid(["--table", str(saved)]) == 0
    assert capsys.readouterr().out.startswith("| N | F | f | sdpa s |")
    assert bench_hybrid(["--table", str(saved), "--tokens", "64"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err
