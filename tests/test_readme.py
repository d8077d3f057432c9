"""Every ```python block of README.md and docs/*.md runs, as a reader would run it, on the organism.

The blocks of one file run in order in one namespace (a later block uses the `m`, `core` and `inputs` of
an earlier one), in a temporary folder prepared as the snippets expect:
- each hub id a snippet passes to `load(...)` is the organism checkpoint, laid out in a temporary hub cache
  (`HF_HOME`, `HF_HUB_OFFLINE=1`) as huggingface_hub lays out a download;
- each `data/NAME.jsonl` a snippet names holds 8 organism image samples;
- `runs/rank` and `runs/headset`, the run folders the README's commands write (`corelens rank`, `corelens
  export`), are made with those commands.
A block written as an interactive session (`>>>` lines) runs as a doctest, so its printed output is checked;
so is a block followed directly by a ```text block: what the block prints must be that text.
A block that cannot run offline is marked by `<!-- norun: reason -->` on the line before its fence; the
marker is the only way to skip one.

The README's "Use the heads elsewhere" section and docs/integrations.md run whole: their ```bash and
```python blocks in order, each shell block by bash in the same folder (the environment's `corelens`,
`python`, `accelerate` first on PATH). The README's section runs verbatim in a folder laid out as the tour
leaves the repository root (`src/corelens/organism/checkpoint`, the tour's own data command run as written,
`runs/rank` ranked on the first samples of its `data/rank/document.jsonl`): nothing it names is made for it.
For docs/integrations.md, a hub dataset id given to `--heads` or `heads=` is the exported `runs/headset`,
laid out in the hub cache as a download; `data/pope/test.parquet` is a few rows in POPE's published schema.
Each lmms-eval command must leave its results under its `--output_path`.
"""

from __future__ import annotations

import contextlib
import doctest
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from corelens.cli import main
from corelens.data import read_samples
from corelens.organism import organism_path
from corelens.organism.tasks import generate

pytestmark = pytest.mark.e2e  # whole workflows: `make check` leaves this file out

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\s*$")
SHELL_FENCE = re.compile(r"^```bash\s*$")
NORUN = re.compile(r"^<!--\s*norun:\s*(\S.*?)\s*-->$")
HUB_ID = re.compile(r"""\bload\(\s*["']([A-Za-z0-9][\w.-]*/[\w.-]+)["']""")
DATA = re.compile(r"""["'](data/[\w.-]+\.jsonl)["']""")
SHELL_HUB_ID = re.compile(r"(?:--model |pretrained=)([A-Za-z0-9][\w.-]*/[\w.-]+)")
SHELL_DATA = re.compile(r"(?<![\w/.-])(data/[\w.-]+\.jsonl)")
HUB_HEADS = re.compile(r"(?:--heads |heads=|full=)([A-Z][\w.-]*/[A-Z][\w.-]*)")
OUTPUT = re.compile(r"--output_path (\S+)")
POPE = "data/pope/test.parquet"
# Where each workflow of "Use the heads elsewhere" is shown: (document, section heading or None for all).
WORKFLOWS = [("README.md", "Use the heads elsewhere"), ("docs/integrations.md", None)]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def blocks(markdown: str, fence: re.Pattern = FENCE) -> list[tuple[int, str, str | None]]:
    """Return (line of the first code line, code, norun reason or None) for each block opened by `fence`."""
    lines = markdown.splitlines()
    out = []
    i = 0
    while i < len(lines):
        if not fence.match(lines[i]):
            i += 1
            continue
        before = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
        marker = NORUN.match(before)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        out.append((i + 2, "\n".join(lines[i + 1 : end]) + "\n", marker.group(1) if marker else None))
        i = end + 1
    return out


def printed(markdown: str) -> dict[int, str]:
    """Return {line of a ```python block's first code line: the ```text block right after it} (what it prints)."""
    lines = markdown.splitlines()
    out = {}
    for line, code, _ in blocks(markdown):
        after = line - 1 + len(code.splitlines()) + 1  # the index of the line after the closing fence
        if after < len(lines) and lines[after].strip() == "```text":
            end = next(j for j in range(after + 1, len(lines)) if lines[j].startswith("```"))
            out[line] = "\n".join(lines[after + 1 : end]) + "\n"
    return out


def test_printed_finds_the_text_block_right_after_a_python_block():
    text = "```python\nprint(1)\n```\n```text\n1\n```\n\n```python\nx = 2\n```\n\n```text\nnot output\n```\n"
    assert printed(text) == {2: "1\n"}


def test_blocks_finds_code_and_honours_only_the_norun_marker():
    text = (
        "intro\n```python\nx = 1\n```\n\n<!-- norun: uploads to the hub -->\n\n```python\nupload()\n```\n"
        "<!-- a plain comment -->\n```python\ny = 2\n```\n```bash\nls\n```\n"
    )
    assert blocks(text) == [
        (3, "x = 1\n", None),
        (9, "upload()\n", "uploads to the hub"),
        (13, "y = 2\n", None),
    ]


def _hub_cache(home: Path, repo: str) -> None:
    """Lay the organism out as huggingface_hub's cache holds `repo`: refs/main -> snapshots/<commit>/."""
    folder = home / "hub" / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(COMMIT)
    (folder / "snapshots").mkdir(exist_ok=True)
    shutil.copytree(organism_path(), folder / "snapshots" / COMMIT, dirs_exist_ok=True)


def _prepare(folder: Path, code: str) -> None:
    """Make the models, data and run folders the snippets of one document read (see the module docstring)."""
    ids = sorted(set(HUB_ID.findall(code)))
    for repo in ids:
        _hub_cache(folder / "hf", repo)
    for name in sorted(set(DATA.findall(code))):
        path = generate("image", folder / Path(name).parent, 8, seed=1)
        path.rename(folder / name)
    if "runs/rank" in code or "runs/headset" in code:
        data = generate("image", folder / "prep", 8, seed=2)
        model = ids[0] if ids else str(organism_path())
        rank = ["rank", "--model", model, "--data", str(data), "--out", "runs/rank", "--overlays", "0"]
        assert main(rank) == 0
        if "runs/headset" in code:
            assert main(["export", "runs/rank", "--out", "runs/headset", "--keep", "10%"]) == 0


DOCUMENTED = [d for d in DOCUMENTS if blocks(d.read_text())]


def test_every_python_fence_of_the_readme_is_found():
    text = (ROOT / "README.md").read_text()
    found = blocks(text)
    markers = [line for line in text.splitlines() if NORUN.match(line.strip())]
    assert len(found) == text.count("```python\n") > 0
    assert len([b for b in found if b[2] is None]) == len(found) - len(markers)
    assert any("cl.load(" in code for _, code, reason in found if reason is None)


def _workflow_lines(document: Path) -> set[int]:
    """Return the lines of `document` that a section of WORKFLOWS holds (run by test_heads_elsewhere_workflows_run)."""
    name = str(document.relative_to(ROOT))
    text = document.read_text()
    held = set()
    for doc, heading in WORKFLOWS:
        if doc == name and heading is not None:
            held |= {j + 1 for j, line in enumerate(section(text, heading).splitlines()) if line}
    return held


@pytest.mark.parametrize("document", DOCUMENTED, ids=lambda d: str(d.relative_to(ROOT)))
def test_python_blocks_run(document, tmp_path, monkeypatch):
    held = _workflow_lines(document)
    runnable = [(line, code) for line, code, reason in blocks(document.read_text()) if reason is None]
    runnable = [(line, code) for line, code in runnable if line not in held]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _prepare(tmp_path, "".join(code for _, code in runnable))
    namespace: dict = {"__name__": "__readme__"}
    name = str(document.relative_to(ROOT))
    quoted = printed(document.read_text())
    for line, code in runnable:
        if code.lstrip().startswith(">>>"):  # an interactive session: its printed output is checked too
            test = doctest.DocTestParser().get_doctest(code, namespace, name, name, line - 1)
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
            runner.run(test, out=lambda text, at=line: pytest.fail(f"{name}:{at}:\n{text}", pytrace=False))
            continue
        # Padded so that a traceback names the document's own line.
        with contextlib.redirect_stdout(io.StringIO()) as said:
            exec(compile("\n" * (line - 1) + code, name, "exec"), namespace)
        if line in quoted:  # the output the document shows is what the block prints
            assert said.getvalue() == quoted[line], f"{name}:{line}: prints\n{said.getvalue()}"


def section(markdown: str, heading: str) -> str:
    """Return the text of the `## heading` section (other lines blanked, so line numbers stay the document's)."""
    lines = markdown.splitlines()
    start = lines.index(f"## {heading}")
    end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
    return "\n".join(line if start <= j < end else "" for j, line in enumerate(lines)) + "\n"


def _pope(path: Path) -> None:
    """Write a few rows of POPE's published schema (question_id, question, answer, image, ...) to `path`."""
    from datasets import Dataset, Features, Value
    from datasets import Image as ImageFeature

    data = generate("image", path.parent / "images", 4, seed=5)
    samples, _ = read_samples(data)
    rows = {"id": [], "question_id": [], "question": [], "answer": [], "image_source": [], "image": [],
            "category": []}  # fmt: skip
    for i, s in enumerate(samples):
        colour = s.answer.split()[0]
        asked = colour if i % 2 == 0 else ("blue" if colour != "blue" else "red")
        for key, value in (("id", str(i)), ("question_id", str(i + 1)), ("image", str(s.images[0])),
                           ("question", f"Is there a {asked} object in the image?"), ("category", "random"),
                           ("answer", "yes" if asked == colour else "no"), ("image_source", s.id)):  # fmt: skip
            rows[key].append(value)
    features = Features({k: ImageFeature() if k == "image" else Value("string") for k in rows})
    Dataset.from_dict(rows, features=features).to_parquet(str(path))


def _publish(home: Path, folder: Path, repo: str) -> None:
    """Lay an exported head set out as huggingface_hub's cache lays out the dataset `repo`."""
    base = home / "hub" / ("datasets--" + repo.replace("/", "--"))
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / "main").write_text(COMMIT)
    shutil.copytree(folder, base / "snapshots" / COMMIT, dirs_exist_ok=True)


def _shell(folder: Path, name: str, line: int, code: str) -> None:
    """Run one shell block as a reader would (bash, -e), with this environment's programs first on PATH."""
    for repo in sorted(set(HUB_HEADS.findall(code))):
        _publish(folder / "hf", folder / "runs" / "headset", repo)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}  # fmt: skip
    proc = subprocess.run(["bash", "-eo", "pipefail", "-c", code], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, f"{name}:{line}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    for out in OUTPUT.findall(code):  # lmms-eval exits 0 after logging an error: its results must exist
        assert list((folder / out).glob("**/*_results.json")), f"{name}:{line}: no results under {out}"


@pytest.mark.parametrize("document, heading", WORKFLOWS, ids=[d for d, _ in WORKFLOWS])
def test_heads_elsewhere_workflows_run(document, heading, tmp_path, monkeypatch):
    """Every command and snippet of the section, in order, in one folder (see the module docstring)."""
    text = (ROOT / document).read_text()
    text = section(text, heading) if heading else text
    shell = [(line, code, "bash") for line, code, reason in blocks(text, SHELL_FENCE) if reason is None]
    python = [(line, code, "python") for line, code, reason in blocks(text) if reason is None]
    assert shell, f"{document}: no shell commands"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    everything = "".join(code for _, code, _ in shell + python)
    shell_code = "".join(code for _, code, _ in shell)
    if document == "README.md":  # verbatim, on what the tour leaves behind
        _tour(tmp_path, (ROOT / document).read_text())
        _run_blocks(tmp_path, document, shell, python, printed(text))
        return
    for repo in sorted(set(SHELL_HUB_ID.findall(shell_code)) - set(HUB_ID.findall(everything))):
        _hub_cache(tmp_path / "hf", repo)
    for name in sorted(set(SHELL_DATA.findall(shell_code)) - set(DATA.findall(everything))):
        generate("image", tmp_path / "data" / "shell", 8, seed=1).rename(tmp_path / name)
    if POPE in everything:
        (tmp_path / POPE).parent.mkdir(parents=True, exist_ok=True)
        _pope(tmp_path / POPE)
    # The export command of the section writes runs/headset itself; the rank run it reads is prepared.
    exported = re.search(r"corelens export \S+ --out runs/headset", shell_code)
    _prepare(tmp_path, everything.replace("runs/headset", "runs/rank") if exported else everything)
    _run_blocks(tmp_path, document, shell, python, printed(text))


def _run_blocks(folder: Path, document: str, shell: list, python: list, quoted: dict[int, str]) -> None:
    """Run the shell and python blocks in document order in `folder` (a python block's quoted output checked)."""
    namespace: dict = {"__name__": "__readme__"}
    for line, code, kind in sorted(shell + python):
        if kind == "bash":
            _shell(folder, document, line, code)
            continue
        with contextlib.redirect_stdout(io.StringIO()) as said:
            exec(compile("\n" * (line - 1) + code, document, "exec"), namespace)
        if line in quoted:
            assert said.getvalue() == quoted[line], f"{document}:{line}: prints\n{said.getvalue()}"


def _tour(folder: Path, readme: str) -> None:
    """Lay `folder` out as the README's tour leaves the repository root: the organism where the repository
    keeps it, the tour's first command (the samples) run as written, and `runs/rank` ranked with the tour's
    options on the first 6 of its samples (the full 24 take minutes; the folder's files are the same)."""
    checkpoint = folder / "src" / "corelens" / "organism" / "checkpoint"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.symlink_to(organism_path(), target_is_directory=True)
    tour = section(readme, "A tour on the bundled model")
    first = blocks(tour, SHELL_FENCE)[0]
    _shell(folder, "README.md", first[0], first[1].split("\nM=")[0])
    line = next(c for _, c, _ in blocks(tour, SHELL_FENCE) if c.startswith("corelens rank"))
    args = line.split()[1:]
    args[args.index("$M")] = str(checkpoint)
    assert main([*args, "--limit", "6"]) == 0
