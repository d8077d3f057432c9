"""One self-contained HTML page for a study: every run's manifest, tables and figures (embedded as data URIs).

Any corelens run directory can be given: the page shows its manifest (command, model, data, versions, the
command line), every CSV table in it (first rows), every figure under `figures/`, and for rank runs the
sparsity of the ranking. A small script marks on `<body data-figures="loaded/total">` how many figures
the browser decoded, so a headless browser test can check that every figure loaded.
"""

from __future__ import annotations

import base64
import html
import json
import time
from pathlib import Path

import pandas as pd

from corelens.errors import CorelensError
from corelens.metrics.topology import sparsity
from corelens.report import explorer
from corelens.report.summary import anchor, shared_settings, summary_section

MAX_ROWS = 12
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; } h3 { font-size: 1em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ddd; padding: 2px 8px; text-align: right; } th { background: #f3f3f3; }
figure { display: inline-block; margin: 0.5em; vertical-align: top; }
figure img { max-width: 100%; border: 1px solid #eee; } figcaption { font-size: 0.8em; color: #555; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 12px; font-size: 0.85em; }
details { margin: 0.5em 0; } summary { cursor: pointer; color: #555; }
dt { font-weight: 600; } dd { margin: 0; font-family: monospace; word-break: break-all; }
"""
SCRIPT = """
window.addEventListener('load', function () {
  var images = Array.from(document.images);
  var ok = images.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.body.dataset.figures = ok + '/' + images.length;
});
"""


def _manifest(run: Path) -> dict:
    path = run / "manifest.json"
    if not path.is_file():
        raise CorelensError(f"{run} is not a corelens run directory: manifest.json is missing")
    return json.loads(path.read_text())


def _definition_list(items: dict) -> str:
    rows = "".join(f"<dt>{html.escape(str(k))}</dt><dd>{html.escape(str(v))}</dd>" for k, v in items.items())
    return f"<dl>{rows}</dl>"


def _table(path: Path) -> str:
    frame = pd.read_csv(path)
    more = len(frame) - MAX_ROWS
    body = frame.head(MAX_ROWS).to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0)
    note = f"<p><small>… {more} more rows in {html.escape(path.name)}</small></p>" if more > 0 else ""
    return f"<h3>{html.escape(path.name)}</h3>{body}{note}"


def _figure(path: Path, run: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    caption = html.escape(str(path.relative_to(run)))
    return f'<figure><img src="data:image/png;base64,{data}" alt="{caption}"><figcaption>{caption}</figcaption></figure>'


def _curve_sentence(info: dict) -> str:
    """Return where the top-k of a rank run settles, from its `stability_curve.json`."""
    half = info["samples"] // 2
    said = []
    for name, n in info["first_n_at_0.9"].items():
        label = name.replace("jaccard_top", "top-") + (" Jaccard" if name != "spearman" else "")
        said.append(f"{label} ≥ 0.9 from n = {n}" if n else f"{label} < 0.9 up to n = {half}")
    return (
        f"<p>Stability curve ({info['samples']} samples, two disjoint n-sample subsets, {info['pairs']} pairs "
        f"per n): {html.escape('; '.join(said))}.</p>"
    )


def run_section(run: Path, shared: dict | None = None) -> str:
    """Return the HTML section of one run directory; manifest entries in `shared` are shown once elsewhere."""
    manifest = _manifest(run)
    settings = manifest.get("settings", {})
    versions = manifest.get("versions", {})
    meta = {
        "command": manifest.get("command"),
        "command line": " ".join(manifest.get("argv") or []),
        **{f"setting: {k}": v for k, v in settings.items()},
        **{f"version: {k}": v for k, v in versions.items()},
        "started": manifest.get("started"),
        "finished": manifest.get("finished"),
    }
    meta = {k: v for k, v in meta.items() if k not in (shared or {})}
    parts = [f"<h2>{html.escape(run.name)} <small>({html.escape(str(manifest.get('command')))})</small></h2>"]
    parts.append(f"<details><summary>manifest</summary>{_definition_list(meta)}</details>")
    heads = run / "heads.csv"
    if manifest.get("command") == "rank" and heads.is_file():
        stats = sparsity(pd.read_csv(heads))
        parts.append(
            "<p>Sparsity: "
            f"{stats['heads_for_50pct']:.1%} of heads hold 50 % of the mass, "
            f"{stats['heads_for_80pct']:.1%} hold 80 %; Gini {stats['gini']:.3f}.</p>"
        )
    curve = run / "stability_curve.json"
    if curve.is_file():
        parts.append(_curve_sentence(json.loads(curve.read_text())))
    parts += [_table(p) for p in sorted(run.glob("*.csv"))]
    parts += [_figure(p, run) for p in sorted((run / "figures").glob("**/*.png"))]
    return f"<section id='{anchor(run)}'>" + "\n".join(parts) + "</section>"


def write_report(
    runs: list[str | Path], out: str | Path, *, title: str = "corelens report", inline: bool = True
) -> Path:
    """Write one self-contained HTML page for `runs` to `out`; return its path.

    With `inline` False the explorer's data go to `<out stem>.explorer.js` beside the page (for `--serve`).
    """
    if not runs:
        raise CorelensError("report needs at least one run directory")
    paths = [Path(r) for r in runs]
    for p in paths:
        if not p.is_dir():
            raise CorelensError(f"run directory {p} does not exist")
    manifests = [_manifest(p) for p in paths]
    shared = shared_settings(manifests) if len(paths) > 1 else {}
    sections = "\n".join(run_section(p, shared) for p in paths)
    listing = "".join(f"<li>{html.escape(str(p))}</li>" for p in paths)
    common = (
        f"<details><summary>settings and versions shared by all {len(paths)} runs</summary>"
        f"{_definition_list(shared)}</details>"
        if shared
        else ""
    )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tasks = explorer.explorer_data(paths)
    script = explorer.data_script(tasks)
    if not inline:
        side = out.with_name(out.stem + ".explorer.js")
        side.write_text(script)
        script = f'<script src="{html.escape(side.name)}"></script>'
    else:
        script = f"<script>{script}</script>"
    page = (
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}{explorer.STYLE}</style><script>{SCRIPT}</script></head><body>"
        f"<h1>{html.escape(title)}</h1>{summary_section(paths, manifests)}"
        f"{explorer.explorer_section(script) if tasks else ''}"
        f"<details><summary>Written {time.strftime('%Y-%m-%d %H:%M:%S %Z')} from {len(paths)} run(s)</summary>"
        f"<ul>{listing}</ul>{common}</details>{sections}</body></html>\n"
    )
    out.write_text(page)
    return out
