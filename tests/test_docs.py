"""The documentation points only inside the repository, and every link into docs/methods.md names a heading.

Users who clone corelens see README.md, docs/, src/ and benchmarks/: a pointer to a team note (METHODS,
DESIGN.md, shared/docs, shared/seeds, a paper summary by its seed number) or a relative path that leaves
the repository points nowhere for them. docs/methods.md is the methods documentation; links into it must
name a heading it has (GitHub's anchor rule).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
METHODS_MD = ROOT / "docs" / "methods.md"
SHIPPED = ("README.md", "docs", "src", "benchmarks")  # what a user who clones the repository reads
TEXT = {".md", ".py", ".sh", ".cpp", ".jinja", ".json", ".csv", ".txt", ".toml", ".log", ".cfg", ".yaml"}

# Pointers out of the repository. Upper-case words only, so EIG_METHODS or "methods.md" do not match.
FORBIDDEN = {
    "team note METHODS": re.compile(r"(?<![A-Za-z_])METHODS(?![A-Za-z_])"),
    "team note DESIGN": re.compile(r"(?<![A-Za-z_])DESIGN(?![A-Za-z_])|DESIGN\.md"),
    "shared/docs": re.compile(r"shared/docs"),
    "shared/seeds": re.compile(r"shared/seeds"),
    "paper summary by seed number": re.compile(r"\bseeds? 00\d\b"),
}
# A path that climbs out of its folder ("../docs/methods.md" from benchmarks/ is fine, "../../x" is not).
CLIMB = re.compile(r"[\w./\\-]*\.\.[/\\][\w./\\-]*")
# Links into docs/methods.md from any file, and `](#...)` links inside docs/methods.md itself.
LINK = re.compile(r"docs/methods\.md#([\w-]+)")
LOCAL_LINK = re.compile(r"\]\(#([\w-]+)\)")
# The sections other documents point to, in the order docs/methods.md gives them.
SECTIONS = ("layout", "ram", "interventions", "hybrid", "geometry", "sap", "padding-cells", "cell-geometry")


def text_files(*tops: str) -> list[Path]:
    """Return the text files under `tops` (files or folders of the repository), caches left out."""
    out = []
    for top in tops:
        path = ROOT / top
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        out += [p for p in candidates if p.is_file() and p.suffix in TEXT and "__pycache__" not in p.parts]
    return out


def slug(heading: str) -> str:
    """Return GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> list[str]:
    """Return the anchors of every heading of a markdown text, in order (outside code fences)."""
    out: list[str] = []
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        match = re.match(r"#{1,6} (.+)", line)
        if fenced or not match:
            continue
        base = slug(match.group(1))
        # GitHub numbers repeated headings: name, name-1, name-2, ...
        out.append(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return out


def test_slug_follows_githubs_rule():
    assert slug("Token mixing and ε_RoPE") == "token-mixing-and-ε_rope"
    assert slug("Baselines and the Table-1 analogue") == "baselines-and-the-table-1-analogue"
    assert slug("Layouts and Ω on the released geometry") == "layouts-and-ω-on-the-released-geometry"
    assert slug("The `--alpha` option (why 16?)") == "the---alpha-option-why-16"
    assert anchors("# A\n## B\n```\n# not a heading\n```\n## B\n") == ["a", "b", "b-1"]


@pytest.mark.parametrize("top", SHIPPED)
def test_no_pointer_leaves_the_repository(top):
    found = []
    for path in text_files(top):
        text = path.read_text(encoding="utf-8", errors="replace")
        for what, pattern in FORBIDDEN.items():
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(ROOT)}:{line}: {what} ({match.group(0)!r})")
        for match in CLIMB.finditer(text):
            target = (path.parent / match.group(0).replace("\\", "/")).resolve()
            if ROOT not in target.parents:
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(ROOT)}:{line}: leaves the repository ({match.group(0)!r})")
    assert not found, "pointers outside the repository:\n" + "\n".join(found)


def test_methods_has_its_sections_in_order():
    have = anchors(METHODS_MD.read_text(encoding="utf-8"))
    missing = [s for s in SECTIONS if s not in have]
    assert not missing, f"docs/methods.md lacks the sections {missing}"
    assert sorted(SECTIONS, key=have.index) == list(SECTIONS)


def test_every_methods_anchor_exists():
    have = set(anchors(METHODS_MD.read_text(encoding="utf-8")))
    used = []
    for path in text_files(*SHIPPED, "tests"):
        text = path.read_text(encoding="utf-8", errors="replace")
        used += [(path, m.group(1)) for m in LINK.finditer(text)]
        if path == METHODS_MD:
            used += [(path, m.group(1)) for m in LOCAL_LINK.finditer(text)]
    assert len({a for _, a in used}) >= len(SECTIONS), "expected links to every section"
    broken = [f"{path.relative_to(ROOT)}: #{anchor}" for path, anchor in used if anchor not in have]
    assert not broken, "links to docs/methods.md headings that do not exist:\n" + "\n".join(broken)


README_MD = ROOT / "README.md"
DOC_PAGES = sorted((ROOT / "docs").glob("*.md"))
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCED = re.compile(r"^```.*?^```", re.S | re.M)


def links(markdown: str) -> list[str]:
    """Return the targets of the markdown links and images of a text, code fences left out."""
    return MD_LINK.findall(FENCED.sub("", markdown))


def test_links_finds_targets_outside_code_fences():
    text = "[a](docs/x.md#y) ![b](figures/p.png)\n```python\nf[0](1)\n```\n[c](#here)\n"
    assert links(text) == ["docs/x.md#y", "figures/p.png", "#here"]


BENCHMARK_NOTES = sorted((ROOT / "benchmarks").rglob("README.md"))


@pytest.mark.parametrize(
    "document", [README_MD, *DOC_PAGES, *BENCHMARK_NOTES], ids=lambda d: str(d.relative_to(ROOT))
)
def test_every_link_of_the_documentation_resolves(document):
    """A relative link names a file of the repository, and a link to a heading names one that exists."""
    broken = []
    for target in links(document.read_text(encoding="utf-8")):
        path, _, anchor = target.partition("#")
        if re.match(r"[a-z]+:", path):  # a URL: nothing may point outside the repository
            broken.append(f"{target}: points outside the repository")
            continue
        file = (document.parent / path).resolve() if path else document
        if ROOT not in file.parents or not file.exists():
            broken.append(f"{target}: no such file in the repository")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text(encoding="utf-8")):
            broken.append(f"{target}: {file.name} has no heading #{anchor}")
    assert not broken, f"{document.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_the_readme_is_a_front_door_to_every_docs_page():
    """The README stays an entry point (at most 300 lines, issue 29) and links every page of docs/."""
    text = README_MD.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    have = anchors(text)
    for section in (
        "quick-start",
        "install",
        "a-tour-on-the-bundled-model",
        "python-in-ten-lines",
        "documentation",
    ):
        assert section in have, f"README.md lacks the section #{section}"
    linked = {t.partition("#")[0] for t in links(text)}
    missing = [p.name for p in DOC_PAGES if f"docs/{p.name}" not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


TEMPORARY = re.compile(rb"/tmp/|pytest-of-|/var/folders/|/private/var/")  # a test's or a machine's scratch


def test_no_page_or_figure_in_docs_names_a_temporary_path():
    """A page or figure of docs/ made from a throw-away run (a pytest folder, /tmp) shows a path no reader has;
    figures are searched byte-wise (a PNG's text chunks; not what its pixels show)."""
    found = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "docs").rglob("*"))
        if path.is_file() and TEMPORARY.search(path.read_bytes())
    ]
    assert not found, f"temporary paths in: {found}"


def test_no_figure_text_chunk_names_a_temporary_path():
    """A PNG's compressed text chunks (zTXt, iTXt) hide their words from a byte search: decoded here."""
    from PIL import Image

    found = []
    for path in sorted((ROOT / "docs").rglob("*.png")):
        with Image.open(path) as picture:
            picture.load()  # text chunks after the pixels are read with them
            text = " ".join(f"{k} {v}" for k, v in picture.text.items())
        if TEMPORARY.search(text.encode()):
            found.append(str(path.relative_to(ROOT)))
    assert not found, f"temporary paths in the text chunks of: {found}"


SHOWCASE = ("report-summary.png", "explorer.png")  # the README's and docs/report.md's screenshots


def test_the_showcase_screenshots_exist_and_stay_small():
    """The two screenshots of the demo's report (benchmarks/showcase.py) exist, are linked, and are under
    300 kB each (256-colour PNGs)."""
    from PIL import Image

    linked = README_MD.read_text(encoding="utf-8") + (ROOT / "docs" / "report.md").read_text(encoding="utf-8")
    for name in SHOWCASE:
        path = ROOT / "docs" / "figures" / name
        assert path.is_file() and f"figures/{name}" in linked, name
        assert 20_000 < path.stat().st_size < 300_000, (name, path.stat().st_size)
        with Image.open(path) as picture:
            assert picture.width >= 1000 and picture.mode == "P", (name, picture.size, picture.mode)
