"""A whole study: rank on three tasks (with overlays) -> `corelens stability` -> `corelens report` (HTML).

The report is rendered in headless Chromium (Debian's package; `.ci/run` installs it): the screenshot must
not be blank and the page must mark every embedded figure as decoded.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from corelens.cli import main
from corelens.organism.tasks import TASKS, WORDS, generate

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    from corelens.models.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("study")
    model = build_tiny_checkpoint("qwen2_5_vl", root / "model", words=WORDS, layers=2, heads=4, kv_heads=2)
    runs = []
    for task in TASKS:
        data = generate(task, root / "data" / task, 3, seed=5)
        out = root / f"rank-{task}"
        assert (
            main(
                [
                    "rank",
                    "--model",
                    str(model),
                    "--data",
                    str(data),
                    "--out",
                    str(out),
                    "--overlays",
                    "1",
                    "--explorer",
                    "200",
                ]
            )
            == 0
        )
        runs.append(out)
    stable = root / "stability"
    assert main(["stability", *map(str, runs), "--out", str(stable), "--k", "2", "--n-boot", "200"]) == 0
    report = root / "report.html"
    assert main(["report", *map(str, runs), str(stable), "--out", str(report), "--title", "tiny study"]) == 0
    return root, runs, stable, report


def test_the_page_names_no_path_of_this_machine(study):
    """A page passed to a colleague names the model, data and runs relative to where the runs sit (issue 44):
    no absolute path of this machine, in the findings, the run sections or the command lines."""
    root, _, _, report = study
    page = report.read_text()
    assert str(root) not in page and str(Path.cwd()) not in page
    assert "Model: model." in page  # the checkpoint beside the runs, by its relative name


def test_rank_draws_overlays_of_top_and_bottom_heads(study):
    _, runs, _, _ = study
    for run in runs:
        overlays = list((run / "figures").glob("overlay-*.png"))
        assert len(overlays) == 1
        image = np.asarray(Image.open(overlays[0]).convert("L"), dtype=float)
        assert image.shape[0] > 200 and image.std() > 10


def test_stability_writes_every_table(study):
    _, runs, stable, _ = study
    spearman = pd.read_csv(stable / "spearman.csv")
    assert sorted(zip(spearman["a"], spearman["b"])) == sorted(
        [("image", "video"), ("image", "document"), ("video", "document")]
    )
    assert ((spearman["spearman"] >= -1) & (spearman["spearman"] <= 1)).all()
    assert (spearman["low"] <= spearman["high"]).all()
    assert len(pd.read_csv(stable / "jaccard.csv")) == 3
    core = pd.read_csv(stable / "core_set.csv")
    assert len(core) == 8 and {"rank_image", "rank_video", "rank_document", "mean_rank"} <= set(core.columns)
    assert set(pd.read_csv(stable / "topology.csv")["run"]) == set(TASKS)
    assert pd.read_csv(stable / "depth.csv").groupby("run")["core_heads"].sum().eq(2).all()
    for figure in ("spearman.png", "depth.png"):
        assert (stable / "figures" / figure).stat().st_size > 5000
    manifest = json.loads((stable / "manifest.json").read_text())
    assert manifest["command"] == "stability" and len(manifest["settings"]["ram_sha256"]) == 3


def test_stability_needs_rank_runs(study, tmp_path, capsys):
    _, runs, stable, _ = study
    assert main(["stability", str(runs[0]), str(stable), "--out", str(tmp_path / "s")]) != 0
    assert "not a finished rank run" in capsys.readouterr().err


def test_report_is_self_contained_with_manifests(study):
    _, runs, _, report = study
    text = report.read_text()
    sources = re.findall(r'<img src="([^"]*)"', text)
    assert len(sources) == 3 * 2 + 2  # heatmap + overlay per rank run, two stability figures
    assert all(s.startswith("data:image/png;base64,") for s in sources)
    assert "http://" not in text and "https://" not in text
    for run in runs:
        assert run.name in text
    assert "spearman.csv" in text and "heads.csv" in text and "of heads hold 50 %" in text
    assert "version: transformers" in text and "command line" in text


def test_report_opens_with_findings_and_collapses_manifests(study):
    _, runs, stable, report = study
    text = report.read_text()
    findings = text[text.index("<section id='findings'>") : text.index("</section>")]
    assert text.index("id='findings'") < text.index("<details>") < text.index(f"id='run-{runs[0].name}'")
    for run in runs:
        best = pd.read_csv(run / "heads.csv").sort_values("rank").iloc[0]
        assert f'href="#run-{run.name}"' in findings
        assert (
            f"L{int(best.layer)}H{int(best['head'])} {100 * best.mass:.0f} % (lift {best.lift:.1f}×)"
            in findings
        )
    first = pd.read_csv(stable / "spearman.csv").iloc[0]
    assert f"{first.spearman:.2f} [{first.low:.2f}, {first.high:.2f}]" in findings
    # Shared entries appear once; every run's own manifest sits in a collapsed <details>.
    assert text.count("version: transformers") == 1 and text.count("<summary>manifest</summary>") == 4


@pytest.mark.e2e  # a browser
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_report_renders_in_headless_chromium(study, tmp_path):
    _, _, _, report = study
    profile = tmp_path / "profile"
    from cdp import HEADLESS

    common = [CHROMIUM, *HEADLESS, f"--user-data-dir={profile}"]
    dom = subprocess.run(
        [*common, "--virtual-time-budget=5000", "--dump-dom", report.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    images = len(re.findall(r"<img ", dom))
    assert images == 8 and f'data-figures="{images}/{images}"' in dom
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*common, "--window-size=1200,2400", f"--screenshot={shot}", report.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.shape == (2400, 1200) and pixels.std() > 5 and (pixels < 128).mean() > 0.005


@pytest.fixture
def browser(tmp_path):
    from cdp import Browser

    page = Browser(CHROMIUM, tmp_path / "profile", 1200, 1400)
    for domain in ("Page", "Network", "Runtime", "Log"):
        page.call(f"{domain}.enable")
    yield page
    page.close()


def _screenshot(page, name: str, tmp_path) -> np.ndarray:
    # The README's showcase shots come from the demo's report (benchmarks/showcase.py), not from this test.
    pixels = np.asarray(Image.open(page.screenshot(tmp_path / name)).convert("L"), dtype=float)
    assert pixels.std() > 5 and (pixels < 128).mean() > 0.005  # not blank
    return pixels


@pytest.mark.e2e  # a browser
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_head_explorer_in_headless_chromium(study, browser, tmp_path):
    _, runs, _, report = study
    browser.call("Page.navigate", url=report.as_uri())
    browser.wait(
        "document.body && document.body.dataset.explorer === 'ready' && !!document.body.dataset.figures"
    )
    _screenshot(browser, "report-summary.png", tmp_path)
    heads = pd.read_csv(runs[0] / "heads.csv").sort_values("rank")
    first, last = (f"L{int(r.layer)}H{int(r['head'])}" for _, r in heads.iloc[[0, -1]].iterrows())

    def panel(slot: str) -> dict:
        return browser.evaluate(
            f"(function () {{ var p = document.getElementById('panel-{slot}');"
            " var f = Array.from(p.querySelectorAll('figure.overlay'));"
            " return {label: p.querySelector('.head-label').textContent, ram: p.querySelector('.ram').dataset.value,"
            " stats: p.querySelector('.stats').textContent, heads: f.map(function (e) { return e.dataset.head; }),"
            " drawn: p.querySelectorAll('canvas[data-drawn]').length}; })()"
        )

    browser.click(f'#grid td[data-head="{first}"]')
    browser.wait("document.querySelectorAll('#panel-a canvas[data-drawn]').length === 3")
    a = panel("a")
    assert a["label"] == f"A: {first}" and a["heads"] == [first] * 3  # one overlay per stored sample
    assert float(a["ram"]) == pytest.approx(heads.iloc[0].mass, abs=1e-12)
    assert all(f"{run.name} " in a["stats"] for run in runs)  # its rank in every task
    browser.click("#compare")
    browser.click(f'#grid td[data-head="{last}"]')
    browser.wait("document.querySelectorAll('#panel-b canvas[data-drawn]').length === 3")
    assert panel("b")["label"] == f"B: {last}" and panel("a")["label"] == f"A: {first}"
    assert float(panel("b")["ram"]) == pytest.approx(heads.iloc[-1].mass, abs=1e-12)
    browser.evaluate("document.getElementById('explorer').scrollIntoView()")
    _screenshot(browser, "explorer.png", tmp_path)
    browser.click("#compare")
    second = f"L{int(heads.iloc[1].layer)}H{int(heads.iloc[1]['head'])}"
    browser.type("#head-search", second.lower())
    browser.wait(f"document.querySelector('#panel-a .head-label').textContent === 'A: {second}'")
    browser.type("#head-search", "L99H0")
    assert browser.evaluate("document.getElementById('search-error').textContent").startswith("no head L99H0")
    ram = pd.read_parquet(runs[0] / "ram.parquet")
    sample = ram[ram["sample_id"] == ram["sample_id"].iloc[0]].sort_values("mass", ascending=False).iloc[0]
    top = browser.evaluate("document.querySelector('#sample-heads .sample-top a').dataset.head")
    assert top == f"L{int(sample.layer)}H{int(sample['head'])}"
    assert browser.errors() == []
    assert [u for u in browser.requests() if not u.startswith(("file:", "data:"))] == []


def _many_samples(run: Path, out: Path, count: int) -> Path:
    """Copy a rank run with its explorer data repeated to `count` samples (the page pages them)."""
    shutil.copytree(run, out)
    arrays, meta = dict(np.load(run / "explorer.npz")), json.loads((run / "explorer.json").read_text())
    stored = len(meta["samples"])
    np.savez(out / "explorer.npz", **{f"{k}_{i}": arrays[f"{k}_{i % stored}"] for i in range(count)
                                      for k in ("maps", "scale", "heads")})  # fmt: skip
    meta["samples"] = [{**meta["samples"][i % stored], "id": f"copy-{i:02d}"} for i in range(count)]
    (out / "explorer.json").write_text(json.dumps(meta))
    return out


def _wide_hybrid_run(out: Path) -> Path:
    """A hybrid run's folder with every hybrid.csv column (the widest table of a report), no model."""
    from corelens.experiments.hybrid import COLUMNS

    out.mkdir()
    rows = []
    for kind, seed, acc in [("dense", None, 1.0), ("top", None, 1.0), ("random", 0, 0.25), ("random", 1, 0.5),
                            ("bottom", None, 0.25)]:  # fmt: skip
        row = dict.fromkeys(COLUMNS, 1.0)
        row.update(set=kind, keep="100%" if kind == "dense" else "2", seed=seed, accuracy=acc, n=8,
                   correct=int(8 * acc), ci_low=max(0.0, acc - 0.3), ci_high=min(1.0, acc + 0.3),
                   granularity="query", heads="L0H0 L0H1 L0H2 L0H3 L1H0 L1H1 L1H2 L1H3 " * 4)  # fmt: skip
        rows.append(row)
    pd.DataFrame(rows, columns=COLUMNS).to_csv(out / "hybrid.csv", index=False)
    manifest = {"command": "hybrid", "settings": {"data": "image.jsonl"}, "samples": 8}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def _contrast(a: str, b: str) -> float:
    """Return the WCAG contrast ratio of two computed CSS colours ("rgb(r, g, b)")."""

    def luminance(colour: str) -> float:
        channels = [int(c) / 255 for c in re.findall(r"\d+", colour)[:3]]
        linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def _strongest_head(browser, sample: int) -> str:
    """Show in panel A the head whose largest cell of stored sample `sample` (of task 0) is the sample's
    largest of any head; return the sample's id."""
    name, sid = browser.evaluate(
        f"(function () {{ var s = EXPLORER[0].samples[{sample}], best = 0;"
        " s.scale.forEach(function (v, k) { if (v * s.panel[k] > s.scale[best] * s.panel[best]) best = k; });"
        " return [s.heads[best], s.id]; })()"
    )
    browser.type("#head-search", name)
    browser.wait(
        f"!!document.querySelector('#panel-a figure.overlay[data-sample=\"{sid}\"] canvas[data-drawn]')"
    )
    return sid


def _overlay_cells(browser, sid: str, slot: str = "a") -> list[dict]:
    """Per cell of sample `sid`'s map in panel `slot`: its level (share of the head's whole attention over the
    sample's largest), the largest channel difference from the plain picture in the middle third of the cell
    and the number of pixels changed in the rest of the cell (its border band)."""
    return browser.evaluate(
        f"(async function () {{ var fig = document.querySelector('#panel-{slot} figure.overlay[data-sample=\"{sid}\"]');"
        " var canvas = fig.querySelector('canvas'), t = EXPLORER.filter(function (t) { return t.samples.some(function (x) { return x.id === fig.dataset.sample; }); })[0];"
        " var s = t.samples.filter(function (x) { return x.id === fig.dataset.sample; })[0];"
        " var index = s.heads.indexOf(fig.dataset.head), rows = s.shape[0], cols = s.shape[1], n = rows * cols, raw = atob(s.maps);"
        " var top = Math.max.apply(null, s.scale.map(function (v, k) { return v * s.panel[k]; })) || 1;"
        " var img = new Image(); await new Promise(function (ok) { img.onload = ok; img.src = 'data:image/jpeg;base64,' + s.picture; });"
        " var plain = document.createElement('canvas'); plain.width = canvas.width; plain.height = canvas.height;"
        " plain.getContext('2d').drawImage(img, 0, 0, plain.width, plain.height);"
        " var shown = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;"
        " var base = plain.getContext('2d').getImageData(0, 0, plain.width, plain.height).data;"
        " var sx = canvas.width / s.size[0], sy = canvas.height / s.size[1], e = s.extent, out = [];"
        " var cw = (e[2] - e[0]) * sx / cols, ch = (e[3] - e[1]) * sy / rows;"
        " for (var i = 0; i < n; i++) { var x0 = e[0] * sx + (i % cols) * cw, y0 = e[1] * sy + Math.floor(i / cols) * ch, middle = 0, border = 0;"
        "   for (var y = Math.ceil(y0); y < Math.floor(y0 + ch); y++) for (var x = Math.ceil(x0); x < Math.floor(x0 + cw); x++) {"
        "     var d = 0; for (var c = 0; c < 3; c++) d = Math.max(d, Math.abs(shown[4 * (y * canvas.width + x) + c] - base[4 * (y * canvas.width + x) + c]));"
        "     var inner = x >= x0 + cw / 3 && x < x0 + 2 * cw / 3 && y >= y0 + ch / 3 && y < y0 + 2 * ch / 3;"
        "     if (inner) middle = Math.max(middle, d); else if (d > 3) border += 1; }"
        "   out.push({level: raw.charCodeAt(index * n + i) / 255 * s.scale[index] * s.panel[index] / top, middle: middle, border: border}); }"
        " return out; })()"
    )  # fmt: skip


def _synthetic_task(folder: Path, top: str, panel: dict[str, float]) -> Path:
    """A rank run's explorer files for 2 x 2 heads and one 64 x 64 sample of 4 x 4 cells, no model: `top` is
    ranked first; `panel` gives each head's part of its attention on the picture (a map peaked on cell 5)."""
    import base64
    import io

    folder.mkdir(parents=True)
    names = [(0, 0), (0, 1), (1, 0), (1, 1)]
    order = sorted(names, key=lambda lh: f"L{lh[0]}H{lh[1]}" != top)
    mass = [panel[f"L{layer}H{head}"] for layer, head in order]
    table = pd.DataFrame(order, columns=["layer", "head"]).assign(
        mass=mass, share=mass, lift=1.0, rank=[1, 2, 3, 4]
    )
    table.to_csv(folder / "heads.csv", index=False)
    table.assign(sample_id="s0", task="t", n_omega=1, n_visual=16).to_parquet(folder / "ram.parquet")
    share = np.full((4, 4), 0.02)
    share[1, 1] = 1 - 0.02 * 15  # the cell (row 1, col 1) holds most of every head's share of the panel
    maps = np.stack([np.round(255 * share / share.max()).astype(np.uint8)] * 4)
    rng = np.random.default_rng(0)  # a picture of flat blocks: the outline must leave each block's colour
    picture = np.kron(rng.integers(40, 220, (4, 4, 3)), np.ones((16, 16, 1))).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, "JPEG", quality=95)
    np.savez(folder / "explorer.npz", maps_0=maps, scale_0=np.full(4, share.max(), np.float32),
             heads_0=np.asarray(order, np.int16), panel_0=np.asarray(mass, np.float32))  # fmt: skip
    meta = {"id": f"{folder.name}-0", "question": "q", "label": "image 0", "size": [64, 64], "extent": [0, 0, 64, 64],
            "boxes": [], "picture": base64.b64encode(buffer.getvalue()).decode("ascii")}  # fmt: skip
    (folder / "explorer.json").write_text(json.dumps({"samples": [meta], "top": 4, "all_samples": 8}))
    return folder


def _explorer_page(runs: list[Path], out: Path) -> Path:
    """A page of the explorer alone (no manifests needed) over `runs`."""
    from markupsafe import Markup

    from corelens.report import explorer

    tasks = explorer.explorer_data(runs)
    scripts = Markup("<script>{}</script><script>{}</script>").format(
        Markup(explorer.data_script(tasks)), Markup(explorer.EXPLORER_JS)
    )
    out.write_text(f"<!doctype html><html><head><meta charset='utf-8'><style>{explorer.STYLE}</style></head>"
                   f"<body>{explorer.explorer_section(scripts)}</body></html>")  # fmt: skip
    return out


@pytest.mark.e2e  # a browser
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_explorer_tab_shows_its_task_top_head_and_a_null_head_differs_from_a_strong_one(browser, tmp_path):
    """Issue 44: a task's tab selects that task's top head (not the previous task's); on a page, a head with
    28 % of its attention on the picture is outlined and one with 0 % is drawn as the bare picture."""
    image = _synthetic_task(tmp_path / "image", "L1H1", {"L0H0": 0.1, "L0H1": 0.1, "L1H0": 0.1, "L1H1": 0.5})
    document = _synthetic_task(
        tmp_path / "document", "L0H1", {"L0H0": 0.0, "L0H1": 0.28, "L1H0": 0.1, "L1H1": 0.05}
    )
    browser.call("Page.navigate", url=_explorer_page([image, document], tmp_path / "page.html").as_uri())
    browser.wait("document.body && document.body.dataset.explorer === 'ready'")
    label = "document.querySelector('#panel-a .head-label').textContent"
    assert browser.evaluate(label) == "A: L1H1"
    browser.click('#tasks button[data-task="document"]')
    browser.wait(f"{label} === 'A: L0H1'")  # the document task's top head, not image's L1H1
    assert browser.evaluate("document.querySelector('#grid td.sel-a').dataset.head") == "L0H1"
    browser.wait("!!document.querySelector('#panel-a canvas[data-drawn]')")
    strong = _overlay_cells(browser, "document-0")
    browser.click("#compare")
    browser.click('#grid td[data-head="L0H0"]')
    browser.wait("!!document.querySelector('#panel-b canvas[data-drawn]')")
    null = _overlay_cells(browser, "document-0", "b")
    assert max(c["middle"] for c in strong + null) <= 3  # inside the cells: the picture's own colours
    assert strong[5]["border"] > 30 and sum(c["border"] for c in null) == 0, (strong[5], null)
    browser.click('#tasks button[data-task="image"]')
    browser.wait(f"{label} === 'A: L1H1'")
    assert browser.errors() == []


@pytest.mark.e2e  # a browser
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_report_reads_at_a_glance_in_chromium(study, browser, tmp_path):
    """At 1400 x 900: no sideways page scroll (the wide hybrid.csv scrolls in its box), the top head shown on
    load, grid ranks labelled at WCAG AA contrast, legends, a head's panel of 8 samples per page within the
    screen, the overlay outlines without recolouring, overlay figures unscaled up to the report's column."""
    from corelens.report.html import write_report
    from corelens.report.overlay import REPORT_WIDTH_PX

    _, runs, stable, _ = study
    many = _many_samples(runs[0], tmp_path / runs[0].name, 20)
    page = write_report(
        [many, *runs[1:], stable, _wide_hybrid_run(tmp_path / "hybrid-wide")], tmp_path / "r.html"
    )
    browser.call(
        "Emulation.setDeviceMetricsOverride", width=1400, height=900, deviceScaleFactor=1, mobile=False
    )
    browser.call("Page.navigate", url=page.as_uri())
    browser.wait(
        "document.body && document.body.dataset.explorer === 'ready' && !!document.body.dataset.figures"
    )
    browser.wait("document.querySelectorAll('#panel-a canvas[data-drawn]').length === 8")
    layout = browser.evaluate(
        "(function () { var box = document.querySelector('#run-hybrid-wide .table-box');"
        " return {page: document.documentElement.scrollWidth, view: window.innerWidth, height: window.innerHeight,"
        " box: box.clientWidth, table: box.scrollWidth, panel: document.getElementById('panel-a').getBoundingClientRect().height,"
        " findings: document.getElementById('findings').textContent}; })()"
    )  # fmt: skip
    assert (
        layout["page"] <= layout["view"] and layout["table"] > layout["box"]
    )  # the table scrolls, not the page
    assert layout["panel"] <= layout["height"]
    assert "nan" not in layout["findings"].lower() and "not decided at n = 8" in layout["findings"]
    heads = pd.read_csv(many / "heads.csv").sort_values("rank")
    top = f"L{int(heads.iloc[0].layer)}H{int(heads.iloc[0]['head'])}"
    assert browser.evaluate("document.querySelector('#panel-a .head-label').textContent") == f"A: {top}"
    assert browser.evaluate("document.querySelector('#grid td.sel-a').dataset.head") == top
    assert "rank" in browser.evaluate("document.querySelector('#grid caption').textContent")
    assert (
        browser.evaluate("document.querySelectorAll('#grid-legend canvas, #map-legend canvas').length") == 2
    )
    cells = browser.evaluate(
        "Array.from(document.querySelectorAll('#grid td.cell')).map(function (td) { var s = getComputedStyle(td);"
        " return [s.color, s.backgroundColor, parseFloat(s.fontSize)]; })"
    )
    assert (
        len(cells) == 8
        and min(_contrast(c, b) for c, b, _ in cells) >= 4.5
        and min(f for *_, f in cells) >= 12
    )
    pager = "document.querySelector('#panel-a .pager .page').textContent"
    assert browser.evaluate(pager) == "samples 1–8 of 20"
    browser.click("#panel-a .pager .next")
    browser.click("#panel-a .pager .next")
    browser.wait("document.querySelectorAll('#panel-a canvas[data-drawn]').length === 4")
    assert browser.evaluate(pager) == "samples 17–20 of 20"
    assert browser.evaluate("document.querySelector('#panel-a .pager .next').disabled")
    browser.click("#panel-a .pager .prev")
    browser.wait("document.querySelectorAll('#panel-a canvas[data-drawn]').length === 8")
    assert browser.evaluate(pager) == "samples 9–16 of 20"
    # The overlay outlines: inside every cell the picture keeps its own colours; the outline is drawn on the
    # cell where the sample's attention is highest.
    cells = _overlay_cells(browser, _strongest_head(browser, 0))
    assert max(c["middle"] for c in cells) <= 3, cells  # the middle third of each cell: the picture's pixels
    best = max(cells, key=lambda c: c["level"])
    assert best["level"] == pytest.approx(1.0) and best["border"] > 30, best  # outlined, in its border band
    assert all(c["border"] <= 3 for c in cells if c["level"] < 0.05), (
        cells
    )  # no outline where it does not look
    widths = browser.evaluate(
        "Array.from(document.images).filter(function (i) { return i.alt.indexOf('overlay-') >= 0; })"
        ".map(function (i) { return [i.clientWidth, i.naturalWidth]; })"
    )
    assert widths and all(shown >= min(natural, REPORT_WIDTH_PX) for shown, natural in widths), widths
    # At phone width (390 px) the page itself still never scrolls sideways; the tables scroll in their boxes.
    browser.call(
        "Emulation.setDeviceMetricsOverride", width=390, height=844, deviceScaleFactor=1, mobile=True
    )
    browser.call("Page.reload")
    browser.wait("document.body && document.body.dataset.explorer === 'ready'")
    phone = browser.evaluate(
        "[document.documentElement.scrollWidth, window.innerWidth, document.querySelectorAll('.table-box').length]"
    )
    assert phone[0] <= phone[1] and phone[2] > 0, phone
    assert browser.errors() == []


@pytest.mark.e2e  # a browser
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_report_serve_on_localhost_stops_on_ctrl_c(study, browser, tmp_path):
    _, runs, _, _ = study
    out = tmp_path / "served.html"
    command = [
        sys.executable,
        "-m",
        "corelens",
        "report",
        *map(str, runs),
        "--out",
        str(out),
        "--serve",
        "--port",
        "0",
    ]
    # A test run launched in the background of a non-interactive shell inherits SIGINT ignored, and Python then
    # keeps it ignored: give the served process the default disposition, as a terminal would.
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout.readline().startswith("wrote ")
        address = re.search(r"serving (http://127\.0\.0\.1:\d+/served\.html)", proc.stdout.readline()).group(
            1
        )
        assert '<script src="served.explorer.js">' in out.read_text()
        browser.call("Page.navigate", url=address)
        browser.wait("document.body && document.body.dataset.explorer === 'ready'")
        assert browser.evaluate("document.querySelectorAll('#grid td.cell').length") == 8
    finally:
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(
            timeout=120
        )  # a guard against a hang, generous for a loaded machine
    assert proc.returncode == 0 and "stopped" in stdout and "Traceback" not in stderr


def test_explorer_maps_are_quantised_and_bounded(study, tmp_path):
    from corelens.capture import attention_maps
    from corelens.data.sample import read_samples
    from corelens.models.loaded import load
    from corelens.report.explorer import MAX_CELLS, bound_bytes, explorer_heads, pool, write_explorer

    root, runs, _, _ = study
    heads = pd.read_csv(runs[0] / "heads.csv").sort_values("rank")
    order = [[int(r.layer), int(r["head"])] for _, r in heads.iterrows()]
    arrays = np.load(runs[0] / "explorer.npz")
    for i in range(3):  # under the default cap of 8 samples every head is stored, in rank order
        maps, scale = arrays[f"maps_{i}"], arrays[f"scale_{i}"]
        assert maps.dtype == np.uint8 and arrays[f"heads_{i}"].tolist() == order and maps.max() == 255
        shares = (maps / 255.0 * scale[:, None, None]).sum(axis=(1, 2))
        assert np.allclose(
            shares, 1.0, atol=maps[0].size * scale.max() / 255
        )  # each map is a share: sums to 1
    samples, _ = read_samples(root / "data" / "image" / "image.jsonl")
    model = load(root / "model", device="cpu")
    kept = explorer_heads(heads, len(samples), top=2, all_samples=1)
    measured = [(s, *attention_maps(model, s, hs), hs) for s, hs in zip(samples, kept)]
    path, _ = write_explorer([(s, p, hs, m) for s, p, m, hs in measured], tmp_path, top=2, all_samples=1)
    small = np.load(path)
    assert [len(small[f"heads_{i}"]) for i in range(3)] == [8, 2, 2]
    assert small["heads_2"].tolist() == order[:2]
    # Each head's part of its whole attention on the drawn panel, as the overlay measures it.
    from corelens.report.overlay import panels, token_grid

    prepared, maps = attention_maps(model, samples[0], [tuple(h) for h in order])
    segment = panels(samples[0], prepared, max_panels=1)[0].segment
    expected = [token_grid(segment, maps[tuple(h)]).sum() for h in order]
    assert np.allclose(small["panel_0"], expected, atol=1e-6) and 0 < min(expected) <= max(expected) <= 1
    assert sum(small[f"maps_{i}"].nbytes for i in range(3)) <= bound_bytes(8, 3, top=2, all_samples=1)
    # The large run: 28 x 28 heads, 200 samples, base64 in the page, under 50 MB.
    assert bound_bytes(28 * 28, 200) * 4 / 3 < 50e6
    grid = np.random.default_rng(0).random((100, 130))
    pooled = pool(grid)
    assert pooled.size <= MAX_CELLS and np.isclose(pooled.sum(), grid.sum())


def test_explorer_data_of_a_28x28_head_200_sample_run_stays_under_50_mb(tmp_path):
    import base64
    import io

    from corelens.report.explorer import (
        ALL_SAMPLES,
        MAX_CELLS,
        PICTURE,
        TOP,
        bound_bytes,
        data_script,
        explorer_data,
    )

    rng = np.random.default_rng(0)
    names = [(layer, head) for layer in range(28) for head in range(28)]
    heads = pd.DataFrame(names, columns=["layer", "head"]).assign(
        mass=rng.random(784), share=rng.random(784), lift=rng.random(784), rank=np.arange(1, 785)
    )
    heads.to_csv(tmp_path / "heads.csv", index=False)
    ids = [f"sample-{i:05d}" for i in range(200)]
    ram = pd.DataFrame(
        {
            "sample_id": np.repeat(ids, 784),
            "layer": np.tile(heads["layer"], 200),
            "head": np.tile(heads["head"], 200),
        }
    ).assign(mass=rng.random(156800), share=rng.random(156800), lift=10 * rng.random(156800))
    ram.to_parquet(tmp_path / "ram.parquet")
    arrays, meta = {}, []
    for i in range(200):  # noise: the worst case for the JPEG and for the maps' base64
        stored = names if i < ALL_SAMPLES else names[:TOP]
        arrays[f"maps_{i}"] = rng.integers(0, 256, (len(stored), 32, MAX_CELLS // 32), dtype=np.uint8)
        arrays[f"scale_{i}"] = rng.random(len(stored)).astype(np.float32)
        arrays[f"panel_{i}"] = rng.random(len(stored)).astype(np.float32)
        arrays[f"heads_{i}"] = np.asarray(stored, dtype=np.int16)
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (PICTURE, PICTURE, 3), dtype=np.uint8)).save(
            buffer, "JPEG", quality=80
        )
        picture = base64.b64encode(buffer.getvalue()).decode("ascii")
        meta.append({"id": ids[i], "question": "q", "label": "image 0", "size": [448, 448],
                     "extent": [0, 0, 448, 448], "boxes": [], "picture": picture})  # fmt: skip
    np.savez(tmp_path / "explorer.npz", **arrays)
    (tmp_path / "explorer.json").write_text(json.dumps({"samples": meta}))
    assert sum(a.nbytes for k, a in arrays.items() if k.startswith("maps_")) == bound_bytes(784, 200)
    size = len(data_script(explorer_data([tmp_path])).encode())
    print(f"explorer data of 28 x 28 heads, 200 samples: {size / 1e6:.1f} MB")
    assert size < 50e6


def test_report_serve_on_a_taken_port_is_a_one_line_error(study, tmp_path, capsys):
    import socket

    _, runs, _, _ = study
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = ["report", str(runs[0]), "--out", str(tmp_path / "r.html"), "--serve", "--port", str(port)]
        assert main(command) != 0
    err = capsys.readouterr().err
    assert f"cannot serve on 127.0.0.1:{port}" in err and "Traceback" not in err


def test_a_failed_request_is_one_line_not_a_traceback(capsys):
    from corelens.commands.report import _Server

    server = _Server(("127.0.0.1", 0), lambda *args: None)
    try:
        try:
            raise ValueError("embedded null byte")
        except ValueError:
            server.handle_error(None, ("127.0.0.1", 4321))
    finally:
        server.server_close()
    err = capsys.readouterr().err
    assert err == "corelens: request from 127.0.0.1:4321 failed: ValueError('embedded null byte')\n"


def test_findings_of_flow_and_sap_runs(tmp_path):
    """The Table-1 and SAP findings, read from the organism's committed result tables."""
    import shutil as sh

    from corelens.report.summary import summary_section

    results = Path(__file__).parents[1] / "benchmarks" / "organism" / "results"
    flow, sap = tmp_path / "flow-image", tmp_path / "sap-image"
    flow.mkdir(), sap.mkdir()
    sh.copy(results / "flow-image-table1.csv", flow / "table1.csv")
    sh.copy(results / "sap-image-T1-accuracy.csv", sap / "accuracy.csv")
    text = summary_section(
        [flow, sap], [{"command": "flow", "samples": 20}, {"command": "sap", "samples": 60}]
    )
    table = pd.read_csv(flow / "table1.csv")
    attention = table[table["row"] == "attention"].iloc[0]
    assert f"attention: RID {attention.rid:.3f}, MixIG {attention.mixig:.3f}" in text
    vanilla = pd.read_csv(sap / "accuracy.csv").iloc[0]
    percent = f"{100 * vanilla.accuracy:.0f} % [{100 * vanilla.ci_low:.0f}–{100 * vanilla.ci_high:.0f} %]"
    assert f"vanilla {percent}" in text
    assert '<a href="#run-flow-image">flow-image</a>' in text and "Samples per run" in text


def test_a_resumed_run_says_so_in_the_report(study, tmp_path):
    """Answers logged before a code change are old ones: a resumed run's section says it reused them."""
    import shutil

    from corelens.report.html import run_section

    _, runs, _, _ = study
    fresh = str(run_section(runs[0]))
    copy = shutil.copytree(runs[0], tmp_path / runs[0].name)
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**manifest, "resumed": 2}))
    assert "Resumed" not in fresh and "Resumed 2 time(s)" in str(run_section(copy))
