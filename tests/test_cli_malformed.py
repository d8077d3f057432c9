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
from dataclasses import fields
from pathlib import Path

import pytest

from corelens.cli import main, parser
from corelens.commands.argtypes import existing_path, output_file, output_path, samples_path
from corelens.commands.options import named
from corelens.experiment_registry import experiments
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


COUNTS = [
    pytest.param(path, name(action), id=" ".join((*path, name(action))))
    for path, p in commands(parser())
    for action in p._actions
    if getattr(action.type, "__name__", "") in ("count", "count_or_zero", "seeds")
]


def test_every_count_option_is_bounded() -> None:
    """The draws, resamples and seeds of every command are typed as counts (a renamed option keeps its type)."""
    flags = {option for _, option in (c.values for c in COUNTS)}
    assert {"--n-boot", "--max-draws", "--pairs", "--rank-resamples"} <= flags, flags
    assert len(COUNTS) >= 8


@pytest.mark.parametrize(("path", "option"), COUNTS)
def test_an_absurd_count_is_one_line_before_anything_runs(path, option, valid, capsys, monkeypatch) -> None:
    """--n-boot / --draws / --seeds / --max-draws of 1e12 asked for terabytes (a MemoryError traceback)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = [*path, *required(leaf(path), option, valid), option, "1000000000000"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and ERROR.match(lines[-1]) and "at most 100000" in lines[-1], err


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


# The likeliest first-hour mistakes (issue 29): each is one line `corelens[ CMD]: error: ...`, exit 2, before
# any model loads (the --model below does not exist: had it been loaded first, the error would name it).


def one_error(capsys, argv: list[str]) -> str:
    """Run `argv`; assert exit 2 and one clean error line; return its message."""
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err and code == 2, f"{argv} exited {code}: {err}"
    lines = err.strip().splitlines()
    assert ERROR.match(lines[-1]) and all(line.startswith(("usage:", " ")) for line in lines[:-1]), err
    return ERROR.match(lines[-1]).group(1)


@pytest.fixture(scope="module")
def untargeted(valid, tmp_path_factory) -> Path:
    """The organism's samples without their target boxes: the usual shape of a user's own data."""
    import json

    data = Path(valid["--data"][0])
    path = tmp_path_factory.mktemp("untargeted") / "mine.jsonl"
    records = [json.loads(line) for line in data.read_text().splitlines()]
    for record in records:
        record.pop("targets")
        record["images"] = [str(data.parent / p) for p in record["images"]]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize(
    ("command", "extra", "hint"),
    [
        ("rank", [], "--omega causal"),
        ("ablate", ["--op", "knockout", "--keys", "omega"], "--keys visual"),
        ("sap", [], "--prior vis_attn,complexity,noise"),
        ("importance", ["--op", "knockout", "--keys", "omega"], "--keys visual"),
    ],
)
def test_data_without_targets_stops_before_the_model_loads(command, extra, hint, valid, untargeted, capsys):
    argv = [command, *required(leaf((command,)), "--model", valid), "--model", MISSING, *extra]
    argv[argv.index("--data") + 1] = str(untargeted)
    message = one_error(capsys, argv)
    assert message.startswith(f"{untargeted}: no sample has target boxes") and hint in message


def test_causal_omega_needs_no_targets(valid, untargeted, capsys):
    """With --omega causal the same data pass the check: the next error is the model's."""
    argv = ["rank", "--model", MISSING, "--data", str(untargeted), "--out", valid["--out"][0]]
    assert MISSING in one_error(capsys, [*argv, "--omega", "causal"])


# Every registered experiment that reads a sample file (its config has a `data` field).
READS_SAMPLES = [e.name for e in experiments() if "data" in {f.name for f in fields(named(e.config))}]


@pytest.mark.parametrize("command", READS_SAMPLES)
def test_empty_sample_file_is_one_error_naming_it(command, valid, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    out = tmp_path / "out"
    argv = [command, *required(leaf((command,)), "--data", valid), "--data", str(empty)]
    argv[argv.index("--out") + 1] = str(out)
    assert one_error(capsys, argv) == f"{empty}: no samples: the file holds no records (or --limit is 0)"
    assert not out.exists()  # no table of NaN accuracies (ablate used to write one and exit 0)


def _ranked_on(folder: Path, data: str, heads: int = 32) -> str:
    """A rank run's heads.csv of the organism's first `heads` heads, its manifest naming the data it ranked."""
    import json

    folder.mkdir()
    rows = [f"{i // 8},{i % 8},{1 - i / 32},{i + 1}" for i in range(heads)]
    (folder / "heads.csv").write_text("layer,head,mass,rank\n" + "\n".join(rows) + "\n")
    (folder / "manifest.json").write_text(json.dumps({"command": "rank", "settings": {"data": data}}))
    return str(folder / "heads.csv")


def test_importance_refuses_the_data_the_heads_were_ranked_on(valid, tmp_path, capsys):
    """Before the model loads (--model is missing): measuring on the ranking's own samples is circular."""
    data = valid["--data"][0]
    argv = ["importance", "--model", MISSING, "--data", data, "--heads", _ranked_on(tmp_path / "r", data),
            "--out", str(tmp_path / "out")]  # fmt: skip
    message = one_error(capsys, argv)
    assert message.startswith(f"--data: the heads were identified on the same data ({data})")
    assert message.endswith("(--allow-same-data measures on it anyway)") and not (tmp_path / "out").exists()


def test_importance_needs_every_head_ranked(valid, tmp_path, capsys):
    heads = _ranked_on(tmp_path / "r", "/elsewhere.jsonl", heads=30)
    argv = ["importance", *required(leaf(("importance",)), "--heads", valid), "--heads", heads]
    argv[argv.index("--out") + 1] = str(tmp_path / "out")
    assert main(argv) == 2  # after the model loads (its progress bar may precede the one error line)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"corelens: error: {heads}: a head set of 30 heads does not cover 4 layers x 8 heads " + (
        "(the model has 4 layers x 8 heads)"
    )


def test_every_sample_skipped_is_one_error_with_the_reasons(valid, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a"\n{"id": "a"\n[1]\n')
    argv = ["ablate", *required(leaf(("ablate",)), "--data", valid), "--data", str(bad), "--skip-bad"]
    message = one_error(capsys, argv)
    assert message.startswith(f"{bad}: no sample could be used: all 3 were skipped (invalid JSON: ")
    assert message.endswith("(char 11): 2, a record must be a JSON object, got array: 1)")


def test_runs_count_used_and_skipped_samples_by_reason(tmp_path, capsys):
    """The run driver prints `N samples used, M skipped (reason: count), see LOG`; none used is an error."""
    from corelens.data.sample import Sample, SkippedSample
    from corelens.errors import InputError
    from corelens.runs.driver import Loop, drive
    from corelens.runs.rundir import Run

    samples = [Sample(id=f"s{i}", task="image", question="q", answer="a", source="d.jsonl") for i in range(4)]
    unreadable = [SkippedSample("d.jsonl", 9, None, None, "d.jsonl:9: invalid JSON: oops")]

    def step(sample, done):
        if sample.id != "s0":
            raise InputError(
                "image file not found", file="d.jsonl", line=2, sample=sample.id, field="images[0]"
            )
        return [{"id": sample.id, "status": "ok"}]

    run = Run(tmp_path / "run", "test", {}, argv=[])
    drive(Loop("t", step), samples, run=run, skipped=unreadable, skip_bad=True, progress=True)
    log = tmp_path / "run" / "samples.jsonl"
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed == f"1 samples used, 4 skipped (image file not found: 3, invalid JSON: oops: 1), see {log}"
    run.finish()
    with pytest.raises(
        InputError, match=r"^d.jsonl: no sample could be used: all 3 were skipped \(image file"
    ):
        drive(Loop("t", step), samples[1:], skip_bad=True)


def test_unknown_option_or_command_names_the_nearest(capsys):
    assert (
        one_error(capsys, ["rank", "--modle", "x"])
        == "unrecognized arguments: --modle; did you mean --model?"
    )
    assert one_error(capsys, ["rank", "--bogus"]) == "unrecognized arguments: --bogus"  # nothing near
    assert one_error(capsys, ["bench", "hybrid", "--tokns", "64"]).endswith("did you mean --tokens?")
    assert one_error(capsys, ["rnak"]).endswith("; did you mean 'rank'?")
    assert one_error(capsys, ["rank", "--query", "answr"]).endswith("; did you mean 'answer'?")


def test_every_option_has_help_and_help_shows_defaults(capsys):
    missing = [
        f"{' '.join(path)} {name(action)}"
        for path, p in commands(parser())
        for action in p._actions
        if not action.help and not isinstance(action, argparse._SubParsersAction)
    ]
    assert not missing, f"options without a help line: {missing}"
    with pytest.raises(SystemExit):
        parser().parse_args(["rank", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "(default: question)" in shown and "(default: 1%,5%,10%)" in shown
    assert "(default: None)" not in shown and "(default: False)" not in shown


def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as stop:
        parser().parse_args(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out == f"corelens {version('corelens')}\n"


def test_report_takes_a_folder_of_run_folders(tmp_path, capsys):
    """`corelens report runs/demo`: the run folders inside, in the order they were started."""
    import json

    from corelens.commands.report import run_folders

    for name, started in [("stability", "3"), ("rank-image", "1"), ("ablate-image", "2"), ("data", None)]:
        (tmp_path / name).mkdir()
        if started:
            (tmp_path / name / "manifest.json").write_text(json.dumps({"started": started}))
    assert [p.name for p in run_folders([str(tmp_path)])] == ["rank-image", "ablate-image", "stability"]
    assert run_folders([str(tmp_path / "stability")]) == [tmp_path / "stability"]
    assert one_error(capsys, ["report", str(tmp_path / "data")]).endswith("holds no run folder")
    assert "--out" in one_error(capsys, ["report", str(tmp_path), str(tmp_path / "stability")])


def test_help_and_argument_errors_do_not_import_torch():
    """`corelens --help`, `--version` and an argument error answer without torch or transformers (fast)."""
    import os
    import subprocess
    import sys

    code = (
        "import sys\nfrom corelens.cli import main\n"
        "for argv in (['--version'], ['--help'], ['rank', '--modle', 'x'], ['report', '--help']):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stderr


# Malformed artifacts (issue 31): a headset.json given to --heads, and a policy file, are checked against their
# schemas (docs/schemas/); each fault is one line naming the file and the field, before any model loads.

_ROWS = [{"layer": lyr, "head": hd, "rank": 1 + 2 * lyr + hd} for lyr in range(2) for hd in range(2)]
_SET = {"format": "corelens.headset/1", "model": {"layers": 2, "heads": 2, "kv_heads": 2}, "keep": 1,
        "heads": _ROWS, "provenance": {}}  # fmt: skip


def _with(path: str, value):
    """Return the good head set with the field at dotted `path` set to `value` (a `...` value deletes it)."""
    import copy

    doc = copy.deepcopy(_SET)
    *parents, last = path.split(".")
    target = doc
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    if value is ...:
        del target[last]
    elif isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("model", ..., "field 'model': missing"),
        ("heads", ..., "field 'heads': missing"),
        ("format", "corelens.headset/9", "format 'corelens.headset/9'"),
        ("model.layers", "2", "field 'model.layers': model.layers must be a positive integer"),
        ("model.heads", True, "field 'model.heads'"),
        ("model.id", 5, "field 'model.id'"),
        ("model.identity", {"config": {}}, "field 'model.identity.digest': missing"),
        ("model.identity", {"digest": "ab", "tensors": {"w": 3}}, "field 'model.identity.tensors.w'"),
        ("model.identity", {"digest": "ab", "content": {"w": ["1"]}}, "field 'model.identity.content.w[0]'"),
        ("keep", "1", "field 'keep'"),
        ("provenance", [], "field 'provenance'"),
        ("heads", {"layer": 0}, "field 'heads'"),
        ("heads.2", [1, 0, 3], "field 'heads[2]'"),
        ("heads.1.head", 9, "heads[1]: head 9 is outside 0..1"),
        ("heads.0.layer", -1, "heads[0]: layer -1 is outside 0..1"),
        ("heads.3.layer", "one", "heads[3]: layer 'one' is not an integer"),
        ("heads.3.rank", ..., "missing"),
    ],
)
def test_malformed_headset_is_one_line_naming_file_and_field(path, value, field, valid, tmp_path, capsys):
    import json

    folder = tmp_path / "set"
    folder.mkdir()
    (folder / "headset.json").write_text(json.dumps(_with(path, value)))
    argv = ["ablate", *required(leaf(("ablate",)), "--heads", valid), "--model", MISSING]
    message = one_error(capsys, [*argv, "--heads", str(folder / "headset.json")])
    assert message.startswith(f"{folder / 'headset.json'}: ") and field in message, message


_HYBRID = {"format": "corelens.hybrid-policy/1", "full": [[0, 1]], "sink": 4, "window": 8, "source": {}}


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({**_HYBRID, "full": [[0, "1"]]}, "field 'full[0][1]'"),
        ({**_HYBRID, "full": [[0, -1]]}, "field 'full[0][1]': Input should be greater than or equal to 0"),
        ({**_HYBRID, "sink": 1.5}, "field 'sink'"),
        ({k: v for k, v in _HYBRID.items() if k != "window"}, "field 'window': missing"),
        ({"heads": [[0]], "op": "zero"}, "field 'heads[0][1]': missing"),
        ({"heads": [[0, 1]], "op": "nope"}, "field 'op'"),
        ({"heads": [[0, 1]], "op": "zero", "seed": "7"}, "field 'seed'"),
        ({"heads": [[0, 1]], "op": "zero", "extra": 1}, "field 'extra'"),
        ({"prior": "noise", "layers": 3}, "field 'layers'"),
        ({"format": "corelens.hybrid-policy/2"}, "not a hybrid policy"),
    ],
)
def test_malformed_policy_is_one_line_naming_file_and_field(doc, field, tmp_path):
    import json

    from corelens.errors import CorelensError
    from corelens.integrations.lmms_eval.policy import load_policy

    path = tmp_path / "policy.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(CorelensError) as err:
        load_policy(path)
    message = str(err.value)
    assert str(path) in message and field in message and "\n" not in message, message
    if doc.get("format", "").startswith("corelens.hybrid"):  # every reader converts an old file the same way
        from corelens.integrations.kvpress import PolicyPress
        from corelens.policies import Policy

        for read in (Policy.from_file, PolicyPress):
            with pytest.raises(CorelensError) as err:
                read(path)
            message = str(err.value)
            assert str(path) in message and field in message and "\n" not in message, message
