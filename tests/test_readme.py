"""Every ```python block of README.md and docs/*.md runs, as a reader would run it, on the organism.

The blocks of one file run in order in one namespace (a later block uses the `m`, `core` and `inputs` of
an earlier one), in a temporary folder prepared as the snippets expect:
- each hub id a snippet passes to `load(...)` is the organism checkpoint, laid out in a temporary hub cache
  (`HF_HOME`, `HF_HUB_OFFLINE=1`) as huggingface_hub lays out a download;
- each `data/NAME.jsonl` a snippet names holds 8 organism image samples;
- `runs/rank` and `runs/headset`, the run folders the README's commands write (`corelens rank`, `corelens
  export`), are made with those commands.
A block written as an interactive session (`>>>` lines) runs as a doctest, so its printed output is checked.
A block that cannot run offline is marked by `<!-- norun: reason -->` on the line before its fence; the
marker is the only way to skip one.
"""

from __future__ import annotations

import doctest
import re
import shutil
from pathlib import Path

import pytest

from corelens.cli import main
from corelens.organism import organism_path
from corelens.organism.tasks import generate

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\s*$")
NORUN = re.compile(r"^<!--\s*norun:\s*(\S.*?)\s*-->$")
HUB_ID = re.compile(r"""\bload\(\s*["']([A-Za-z0-9][\w.-]*/[\w.-]+)["']""")
DATA = re.compile(r"""["'](data/[\w.-]+\.jsonl)["']""")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def blocks(markdown: str) -> list[tuple[int, str, str | None]]:
    """Return (line of the first code line, code, norun reason or None) for each ```python block."""
    lines = markdown.splitlines()
    out = []
    i = 0
    while i < len(lines):
        if not FENCE.match(lines[i]):
            i += 1
            continue
        before = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
        marker = NORUN.match(before)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        out.append((i + 2, "\n".join(lines[i + 1 : end]) + "\n", marker.group(1) if marker else None))
        i = end + 1
    return out


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


@pytest.mark.parametrize("document", DOCUMENTED, ids=lambda d: str(d.relative_to(ROOT)))
def test_python_blocks_run(document, tmp_path, monkeypatch):
    runnable = [(line, code) for line, code, reason in blocks(document.read_text()) if reason is None]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _prepare(tmp_path, "".join(code for _, code in runnable))
    namespace: dict = {"__name__": "__readme__"}
    name = str(document.relative_to(ROOT))
    for line, code in runnable:
        if code.lstrip().startswith(">>>"):  # an interactive session: its printed output is checked too
            test = doctest.DocTestParser().get_doctest(code, namespace, name, name, line - 1)
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
            runner.run(test, out=lambda text, at=line: pytest.fail(f"{name}:{at}:\n{text}", pytrace=False))
            continue
        # Padded so that a traceback names the document's own line.
        exec(compile("\n" * (line - 1) + code, name, "exec"), namespace)
