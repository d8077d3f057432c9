"""The extending guides pass where they point: each docs/extending/*.md template is written at the path its guide
names (`<!-- template: PATH -->` before the block) in a copy of the repository, and the house's tests run there.

A block whose path exists already is added to that file (at its end, or after the line that `after "TEXT"` in
the marker names); the others are new files. In the copy, a subprocess (PYTHONPATH: the copy's `src`) runs the
import layers, the registries' tests, the kind's own tests and the template's test, so a guide whose name clashes
with a house rule, is registered twice or misses an import fails here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDES = ROOT / "docs" / "extending"
MARKER = re.compile(r'<!-- template: (\S+?)(?: after "(.+?)")? -->\n```python\n(.*?)^```', re.S | re.M)

# guide -> the tests run in the copy beside test_layers, test_registry and the template's own test.
CHECKS = {
    "policy.md": ["tests/test_policy_invariants.py", "tests/test_extending.py", "tests/test_policies.py"],
    "experiment.md": [
        "tests/test_experiment_registry.py",
        "tests/test_shape.py::test_options_are_the_configs_fields",
        "tests/test_shape.py::test_every_run_command_is_generated_from_its_config",
        "tests/test_shape.py::test_an_output_key_names_one_file",
        "tests/test_cli_startup.py",
    ],
    "family.md": ["tests/test_families.py", "tests/test_parity.py::test_logits_equal_stock_sdpa"],
    "kernel.md": [
        "tests/test_extending_family.py::test_toy_kernel_from_template",
        "tests/test_kernels_split.py::test_bench_kernel_choices_are_the_kernels",
        "tests/test_registered.py",
    ],
    "reader.md": ["tests/test_readers.py", "tests/test_extending_family.py::test_toy_reader_from_template"],
}
# The steps a guide gives in words, done here as its reader would: (path, text there, what it becomes).
STEPS = {
    "kernel.md": [  # 2: import the module, so its kernel registers (its name is a choice with no edit)
        (
            "src/corelens/attention/kernels/__init__.py",
            "from corelens.attention.kernels.interface import KernelInterface, Prefill, kernel\n",
            "from corelens.attention.kernels.interface import KernelInterface, Prefill, kernel\n"
            "from corelens.attention.kernels.my_kernel import my_kernel  # noqa: F401\n",
        ),
    ],
}
SELECT = {"family.md": "my_vl"}  # -k: the parametrised tests of CHECKS on the template's case only

# The family guide's one precondition: transformers has the family's classes. In the copy a plugin stands them in
# (Qwen2-VL's, under `my_vl`), as tests/test_extending_family.py does for its toy.
STAND_IN = {
    "family.md": """
import sys

import transformers
from transformers import AutoConfig, AutoModelForImageTextToText


class MyVLConfig(transformers.Qwen2VLConfig):
    model_type = "my_vl"


class MyVLForConditionalGeneration(transformers.Qwen2VLForConditionalGeneration):
    config_class = MyVLConfig


AutoConfig.register("my_vl", MyVLConfig)
AutoModelForImageTextToText.register(MyVLConfig, MyVLForConditionalGeneration)
module = sys.modules["transformers"]  # importing the Qwen2-VL classes replaced the lazy module there
module.MyVLConfig, module.MyVLProcessor = MyVLConfig, transformers.Qwen2VLProcessor
module.MyVLForConditionalGeneration = MyVLForConditionalGeneration
"""
}


def templates(page: Path) -> list[tuple[str, str, str]]:
    """Return the (path, after, code) of each marked ```python block of a guide."""
    return MARKER.findall(page.read_text())


def template(page: Path, path: str) -> str:
    """Return the code of the block a guide writes at `path`."""
    found = [code for where, _, code in templates(page) if where == path]
    assert len(found) == 1, f"{page.name}: no one python block after <!-- template: {path} -->"
    return found[0]


def copy_repository(to: Path) -> Path:
    """Copy what the tests read (src, tests, docs' text, pyproject) into `to`; no caches or figures."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", "figures", "*.egg-info")
    for name in ("src", "tests", "docs"):
        shutil.copytree(ROOT / name, to / name, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, to / name)
    return to


def write_template(root: Path, path: str, after: str, code: str) -> None:
    """Write one block at `path` under `root`: a new file, or added to the file there (after `after`)."""
    target = root / path
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(code)
    elif not after:
        target.write_text(target.read_text().rstrip("\n") + "\n\n\n" + code)
    else:
        text = target.read_text()
        assert after in text, f"{path}: no line {after!r} to add the guide's block after"
        head, _, tail = text.partition(after)
        target.write_text(head + after + tail.split("\n", 1)[0] + "\n" + code + tail.split("\n", 1)[1])


def own_tests(written: list[tuple[str, str, str]]) -> list[str]:
    """Return the template's own tests: the test files it writes, or the tests it adds to one."""
    own = []
    for path, _, code in written:
        if path.startswith("tests/"):
            added = (ROOT / path).exists()
            own += [f"{path}::{n}" for n in re.findall(r"^def (test_\w+)", code, re.M)] if added else [path]
    return own


def run_tests(root: Path, tests: list[str], select: str | None = None) -> subprocess.CompletedProcess:
    """Run pytest on `tests` in the copy at `root`, with its own sources first on the path (and, where it
    exists, the plugin `stand_in.py` at its root loaded first)."""
    env = {**os.environ, "PYTHONPATH": f"{root / 'src'}{os.pathsep}{root}", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *tests]
    command += ["-p", "stand_in"] if (root / "stand_in.py").exists() else []
    command += ["-k", select] if select else []
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=900)


def test_every_guide_has_its_templates_and_checks():
    assert sorted(p.name for p in GUIDES.glob("*.md")) == sorted(CHECKS)
    for page in GUIDES.glob("*.md"):
        assert templates(page), f"{page.name}: no <!-- template: PATH --> block"
        for path, after, _ in templates(page):  # the fast tier's check: each block has its place
            folder = (ROOT / path).parent  # a new file goes in a folder there, or a new package in one
            assert folder.is_dir() or folder.parent.is_dir(), f"{page.name}: {path}: no such folder"
            assert not after or after in (ROOT / path).read_text(), f"{page.name}: {path} holds no {after!r}"
        for path, text, _ in STEPS.get(page.name, []):
            assert (ROOT / path).read_text().count(text) == 1, f"{page.name}: {path} no longer holds {text!r}"


@pytest.mark.e2e
@pytest.mark.parametrize("guide", sorted(CHECKS))
def test_the_guide_passes_where_it_points(guide, tmp_path):
    root = copy_repository(tmp_path / "repo")
    written = templates(GUIDES / guide)
    for path, after, code in written:
        write_template(root, path, after, code)
    if guide in STAND_IN:
        (root / "stand_in.py").write_text(STAND_IN[guide])
    for path, text, becomes in STEPS.get(guide, []):
        source = (root / path).read_text()
        assert source.count(text) == 1, (
            f"{guide}: {path} no longer holds {text!r}: update STEPS and the guide"
        )
        (root / path).write_text(source.replace(text, becomes))
    own = own_tests(written)
    # A family's own tests are the parametrised family tests (CHECKS); every other guide shows its test.
    assert own or guide in SELECT, f"{guide}: no test of its own (a <!-- template: tests/... --> block)"
    house = ["tests/test_layers.py", "tests/test_registry.py", *own]
    if guide in SELECT:
        runs = [(house, None), (CHECKS[guide], SELECT[guide])]
    else:
        runs = [([*house, *CHECKS[guide]], None)]
    for tests, select in runs:
        done = run_tests(root, tests, select)
        assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
        summary = done.stdout.strip().splitlines()[-1]
        assert " passed" in summary and "skipped" not in summary, summary


CLI_RUN = """
import json, sys
from pathlib import Path

import pandas as pd

from corelens.cli import main
from corelens.organism import organism_path
from corelens.organism.tasks import generate

out = Path(sys.argv[1])
ident, data = generate("image", out / "ident", 4, seed=1), generate("image", out / "eval", 4, seed=2)
model = str(organism_path())
assert main(["rank", "--model", model, "--data", str(ident), "--query", "answer", "--out", str(out / "rank")]) == 0
common = ["ablate", "--model", model, "--data", str(data), "--heads", str(out / "rank" / "heads.csv"),
          "--n-heads", "3", "--sets", "top", "--max-new-tokens", "4"]
scale = {"name": "scale", "factor": 0.0}
assert main([*common, "--policy", json.dumps(scale), "--out", str(out / "scaled")]) == 0
assert main([*common, "--op", "zero", "--out", str(out / "zeroed")]) == 0
assert main([*common, "--op", "scale", "--out", str(out / "half")]) == 0
print(json.dumps({
    "scaled": pd.read_csv(out / "scaled" / "ablation.csv")[["op", "accuracy", "heads"]].to_dict("list"),
    "zeroed": pd.read_csv(out / "zeroed" / "ablation.csv")[["op", "accuracy", "heads"]].to_dict("list"),
    "manifest": json.loads((out / "scaled" / "manifest.json").read_text()),
    "half": json.loads((out / "half" / "manifest.json").read_text()),
    "sets": json.loads((out / "scaled" / "headsets.json").read_text()),
}))
"""


@pytest.mark.e2e
def test_the_guide_policy_runs_from_the_command_line(tmp_path):
    """The issue's measure of "one way per idea": the guide's policy, under the guide's own name and with no file
    touched beside it and its test, runs from `corelens ablate --policy` (and `--op`) and records its parameter."""
    root = copy_repository(tmp_path / "repo")
    for path, after, code in templates(GUIDES / "policy.md"):
        write_template(root, path, after, code)
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CLI_RUN, str(tmp_path / "runs")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    scaled, zeroed = got["scaled"], got["zeroed"]
    assert scaled["op"] == ["scale", "scale"] and zeroed["op"] == ["zero", "zero"]
    assert scaled["heads"] == zeroed["heads"] and scaled["accuracy"] == zeroed["accuracy"]  # factor 0: zeroed
    assert scaled["accuracy"][1] < scaled["accuracy"][0]  # the top heads matter, so the equality can fail
    assert got["manifest"]["policy"] == {"name": "scale", "factor": 0.0}
    assert got["manifest"]["settings"]["policy"] == {"name": "scale", "factor": 0.0}  # not the default 0.5
    assert (
        got["half"]["policy"] == {"name": "scale", "factor": 0.5} and "policy" not in got["half"]["settings"]
    )
    assert [s["policy"]["factor"] for s in got["sets"]] == [0.0, 0.0]
