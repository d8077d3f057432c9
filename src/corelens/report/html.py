"""One self-contained HTML page for a study: every run's manifest, tables and figures (embedded as data URIs).

Any corelens run directory can be given: the page shows its manifest (command, model, data, versions, the
command line), every CSV table in it (first rows), every figure under `figures/`, and for rank runs the
sparsity of the ranking. A small script marks on `<body data-figures="loaded/total">` how many figures
the browser decoded, so a headless browser test can check that every figure loaded.

A run's values (manifest entries, table cells, file and folder names, sample fields, task labels) are data,
possibly hostile: they enter the page only through `markupsafe.Markup` (`Markup(template).format(value)`,
`Markup(sep).join(values)`), which escapes every value that is not itself Markup, so the only markup is
the templates written in this module, `summary.py` and `explorer.py`. The page's Content-Security-Policy
(`policy`) then allows only the scripts and the style sheet it was written with (their SHA-256 hashes) and
`data:` images: a handler or script that got into the markup anyway would not run.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
import time
import urllib.parse
from pathlib import Path

import pandas as pd
from markupsafe import Markup

from corelens.data import jsonfile
from corelens.errors import CorelensError
from corelens.metrics.topology import sparsity
from corelens.report import explorer
from corelens.report.summary import (
    MISSING,
    anchor,
    read_heads,
    shared_settings,
    shown_path,
    shown_paths,
    shown_setting,
    summary_section,
)
from corelens.runs.files import refuse_links_out
from corelens.runs.outputs import FIGURES, MANIFEST, RANK, STABILITY
from corelens.runs.rundir import read_manifest

MAX_ROWS = 12
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; padding: 0 0.8em; max-width: 1100px; color: #222;
       overflow-wrap: anywhere; }
@media (max-width: 600px) { body { margin: 0.8em auto; } figure { display: block; margin: 0.5em 0; }
  dl { grid-template-columns: auto; } }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; } h3 { font-size: 1em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1em; overflow-wrap: normal; }
.table-box { overflow-x: auto; max-width: 100%; } .legend-note { color: #555; font-size: 0.85em; }
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
    path = run / MANIFEST
    if not path.is_file():
        raise CorelensError(f"{run} is not a corelens run directory: {MANIFEST} is missing")
    return read_manifest(path)


def _definition_list(items: dict) -> Markup:
    rows = Markup("").join(Markup("<dt>{}</dt><dd>{}</dd>").format(k, v) for k, v in items.items())
    return Markup("<dl>{}</dl>").format(rows)


def _cell(value) -> object:
    """Return a table cell's value as the page shows it: floats to 4 significant digits, a missing value
    (NaN, None, pd.NA, an empty CSV cell) as "—"."""
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return MISSING
    return f"{value:.4g}" if isinstance(value, float) else value


def _table(path: Path) -> Markup:
    # Written here rather than by DataFrame.to_html: its header row carries a style attribute, which the
    # page's policy refuses, and every cell goes through the same escaping as the rest of the page.
    frame = pd.read_csv(path)
    more = len(frame) - MAX_ROWS
    head = Markup("").join(Markup("<th>{}</th>").format(c) for c in frame.columns)
    rows = Markup("").join(
        Markup("<tr>{}</tr>").format(Markup("").join(Markup("<td>{}</td>").format(_cell(v)) for v in row))
        for row in frame.head(MAX_ROWS).itertuples(index=False)
    )
    note = Markup("<p><small>… {} more rows in {}</small></p>").format(more, path.name) if more > 0 else ""
    # In its own box that scrolls sideways: a wide table (hybrid.csv: 20-odd columns) never widens the page.
    return Markup(
        "<h3>{}</h3><div class='table-box'><table><thead><tr>{}</tr></thead><tbody>{}</tbody></table></div>{}"
    ).format(path.name, head, rows, note)


def _figure(path: Path, run: Path) -> Markup:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    caption = str(path.relative_to(run))
    return Markup(
        '<figure><img src="data:image/png;base64,{}" alt="{}"><figcaption>{}</figcaption></figure>'
    ).format(data, caption, caption)


def _curve_sentence(info: dict) -> str:
    """Return where the top-k of a rank run settles, from its `stability_curve.json`."""
    half = info["samples"] // 2
    said = []
    for name, n in info["first_n_at_0.9"].items():
        label = name.replace("jaccard_top", "top-") + (" Jaccard" if name != "spearman" else "")
        said.append(f"{label} ≥ 0.9 from n = {n}" if n else f"{label} < 0.9 up to n = {half}")
    return Markup(
        "<p>Stability curve ({} samples, two disjoint n-sample subsets, {} pairs per n): {}.</p>"
    ).format(info["samples"], info["pairs"], "; ".join(said))


def run_section(run: Path, shared: dict | None = None) -> Markup:
    """Return the HTML section of one run directory; manifest entries in `shared` are shown once elsewhere."""
    manifest = _manifest(run)
    settings = manifest.get("settings", {})
    versions = manifest.get("versions", {})
    meta = {
        "command": manifest.get("command"),
        "command line": shown_paths(" ".join(manifest.get("argv") or []), run.parent),
        **{f"setting: {k}": shown_setting(k, v, run.parent) for k, v in settings.items()},
        **{f"version: {k}": v for k, v in versions.items()},
        "started": manifest.get("started"),
        "finished": manifest.get("finished"),
    }
    meta = {k: v for k, v in meta.items() if k not in (shared or {})}
    parts = [Markup("<h2>{} <small>({})</small></h2>").format(run.name, manifest.get("command"))]
    resumed = manifest.get("resumed")
    if isinstance(resumed, int) and resumed > 0:  # answers logged before a code change would be old ones
        parts.append(
            Markup("<p class='legend-note'>Resumed {} time(s): answers logged by an earlier start, from {}, are "
                   "reused (a new --out redoes them).</p>").format(resumed, manifest.get("started"))
        )  # fmt: skip
    parts.append(Markup("<details><summary>manifest</summary>{}</details>").format(_definition_list(meta)))
    heads = RANK.path(run, "heads")
    if manifest.get("command") == "rank" and heads.is_file():
        stats = sparsity(read_heads(heads))
        parts.append(
            Markup(
                "<p>Sparsity: {:.1%} of heads hold 50 % of the mass, {:.1%} hold 80 %; Gini {:.3f}.</p>"
            ).format(stats["heads_for_50pct"], stats["heads_for_80pct"], stats["gini"])
        )
    curve = STABILITY.path(run, "curve_info")
    if curve.is_file():
        parts.append(_curve_sentence(jsonfile.load(curve, root=run)))
    parts += [_table(p) for p in sorted(run.glob("*.csv"))]
    parts += [_figure(p, run) for p in sorted((run / FIGURES).glob("**/*.png"))]
    return Markup("<section id='{}'>{}</section>").format(anchor(run), Markup("\n").join(parts))


def _source(text: str) -> str:
    """Return the Content-Security-Policy source that allows one inline script or style: its SHA-256."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode("ascii") + "'"


def policy(scripts: list[str], styles: list[str], *, same_origin_scripts: bool = False) -> str:
    """Return the page's Content-Security-Policy: the inline `scripts` and `styles` it was written with, by
    hash, and `data:` images; nothing else (no other script, no inline handler, no request anywhere).

    `same_origin_scripts` also allows scripts of the page's own origin: the explorer's data file of
    `--serve`, whose server answers nothing but the report's own files.
    """
    script = " ".join([*map(_source, scripts), *(["'self'"] if same_origin_scripts else [])])
    return (
        f"default-src 'none'; script-src {script}; style-src {' '.join(map(_source, styles))}; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )


def _inline(text: str, written: list[str]) -> Markup:
    """Return the `<script>` element of our own script `text` (never data: see `explorer.data_script`) and
    note its text in `written`, which the page's policy allows by hash."""
    written.append(text)
    return Markup("<script>{}</script>").format(Markup(text))


def _write(path: Path, text: str) -> None:
    """Write `text` to `path` through a new temporary file and a rename: a symlink planted at `path` is
    replaced, never followed (so the page cannot overwrite the file it points to, nor be served from there);
    readable by others (0644 less the umask) like every file a run writes, not the temporary file's 0600."""
    with tempfile.NamedTemporaryFile(
        "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", delete=False
    ) as f:
        f.write(text)
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(f.name, 0o644 & ~mask)
    os.replace(f.name, path)


def write_report(
    runs: list[str | Path], out: str | Path, *, title: str = "corelens report", inline: bool = True
) -> Path:
    """Write one self-contained HTML page for `runs` to `out`; return its path (see `write_report_files`)."""
    return write_report_files(runs, out, title=title, inline=inline)[0]


def write_report_files(
    runs: list[str | Path], out: str | Path, *, title: str = "corelens report", inline: bool = True
) -> list[Path]:
    """Write the HTML page of `runs` to `out`; return the page, then every file the page references.

    Figures are data URIs inside the page. With `inline` False the explorer's data go to
    `<out stem>.explorer.js` beside the page (for `--serve`): the one file a page may reference.
    """
    if not runs:
        raise CorelensError("report needs at least one run directory")
    paths = [Path(r) for r in runs]
    for p in paths:
        if not p.is_dir():
            raise CorelensError(f"run directory {p} does not exist")
        # No file from outside a run ends up in a page meant for sharing: a linked figure, table or manifest
        # leading out of its run folder is refused in one line before anything is read.
        refuse_links_out(p)
    manifests = [_manifest(p) for p in paths]
    shared = shared_settings(manifests) if len(paths) > 1 else {}
    sections = Markup("\n").join(run_section(p, shared) for p in paths)
    where = Path(out).resolve().parent
    listing = Markup("").join(
        Markup("<li>{}</li>").format(shown_path(str(p.resolve()), where)) for p in paths
    )
    common = (
        Markup("<details><summary>settings and versions shared by all {} runs</summary>{}</details>").format(
            len(paths), _definition_list(shared)
        )
        if shared
        else ""
    )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tasks = explorer.explorer_data(paths)
    scripts, files = [], [out]
    head_script = _inline(SCRIPT, scripts)
    section = ""
    if tasks and inline:
        data = _inline(explorer.data_script(tasks), scripts)
        section = explorer.explorer_section(data + _inline(explorer.EXPLORER_JS, scripts))
    elif tasks:  # --serve: the data in a file beside the page, allowed as a script of the page's origin
        side = out.with_name(out.stem + ".explorer.js")
        _write(side, explorer.data_script(tasks))
        files.append(side)
        data = Markup('<script src="{}"></script>').format(urllib.parse.quote(side.name))
        section = explorer.explorer_section(data + _inline(explorer.EXPLORER_JS, scripts))
    style = STYLE + explorer.STYLE
    csp = policy(scripts, [style], same_origin_scripts=len(files) > 1)
    page = Markup(
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta http-equiv="Content-Security-Policy" content="{csp}"><title>{title}</title>'
        "<style>{style}</style>{head_script}</head><body><h1>{title}</h1>{summary}{section}"
        "<details><summary>Written {when} from {n} run(s)</summary><ul>{listing}</ul>{common}</details>"
        "{sections}</body></html>\n"
    ).format(
        csp=csp,
        title=title,
        style=Markup(style),
        head_script=head_script,
        summary=summary_section(paths, manifests),
        section=section,
        when=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        n=len(paths),
        listing=listing,
        common=common,
        sections=sections,
    )
    _write(out, page)
    return files
