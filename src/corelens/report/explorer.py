"""The head explorer of a report: a layer x head grid per task; click a head to see its maps on every sample.

Data come from each rank run's `explorer.npz` / `explorer.json` (`write_explorer`, below), its
`heads.csv` and `ram.parquet`; the page draws them with plain JavaScript on canvases (no library, no request).
Two heads can be compared side by side (A and B), a sample picker lists one sample's top and bottom heads, and
the search box takes a head name such as `L12H5`.
"""

from __future__ import annotations

import base64
import io
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from markupsafe import Markup

from corelens.data import jsonfile
from corelens.metrics.ram import read_ram
from corelens.report.summary import read_heads
from corelens.runs.files import write_text, writer
from corelens.runs.outputs import RANK

if TYPE_CHECKING:
    from corelens.data.sample import Sample
    from corelens.models.prepare import Prepared


# The head explorer's data: per-sample, per-head visual attention maps, quantised to uint8 (`explorer.npz`).
#
# Every stored sample keeps its `top` best heads; the first `all_samples` keep every head. A map is the head's
# share of its attention over the cells of the sample's first panel (the one holding the target), average-
# pooled to at most `MAX_CELLS` cells and scaled to 0..255 (its maximum share is kept as a float32), and
# `panel_{i}` keeps the part of the head's whole attention that falls on that panel (float32; the page draws
# share x panel part on one scale for all heads, so a head that looks at the text shows no outline). So a run
# stores at most (heads x all_samples + top x (samples - all_samples)) x MAX_CELLS bytes of maps, plus one
# JPEG of at most `PICTURE` pixels a side per sample: for 28 x 28 heads, 200 samples, top 32 and 8 full
# samples, (784 x 8 + 32 x 192) x 1024 B = 12.7 MB (17 MB once base64-encoded in the page).
MAX_CELLS = 1024
PICTURE = 192
TOP = 32
ALL_SAMPLES = 8


def bound_bytes(n_heads: int, samples: int, *, top: int = TOP, all_samples: int = ALL_SAMPLES) -> int:
    """Return the most bytes of maps a run stores for `n_heads` heads and `samples` samples."""
    full = min(all_samples, samples)
    return (n_heads * full + min(top, n_heads) * (samples - full)) * MAX_CELLS


def pool(grid: np.ndarray, max_cells: int = MAX_CELLS) -> np.ndarray:
    """Return `grid` summed over square blocks so that it has at most `max_cells` cells (shares stay shares)."""
    f = max(1, math.ceil(math.sqrt(grid.size / max_cells)))
    while (
        math.ceil(grid.shape[0] / f) * math.ceil(grid.shape[1] / f) > max_cells
    ):  # rounding up can overshoot
        f += 1
    rows, cols = -(-grid.shape[0] // f) * f, -(-grid.shape[1] // f) * f
    padded = np.zeros((rows, cols))
    padded[: grid.shape[0], : grid.shape[1]] = grid
    return padded.reshape(rows // f, f, cols // f, f).sum(axis=(1, 3))


def _picture(panel) -> str:
    picture = panel.picture.convert("RGB").resize(panel.segment.orig_size)
    picture.thumbnail((PICTURE, PICTURE))
    buffer = io.BytesIO()
    picture.save(buffer, format="JPEG", quality=80)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def write_explorer(
    measured: Iterable[tuple[Sample, Prepared, list[tuple[int, int]], dict[tuple[int, int], np.ndarray]]],
    folder: str | Path,
    *,
    top: int = TOP,
    all_samples: int = ALL_SAMPLES,
) -> tuple[Path, int]:
    """Write `explorer.npz` and `explorer.json` into `folder` from each measured (sample, prepared prompt, heads
    chosen, their maps: `corelens.capture.attention_maps`); return the npz path and its size. The caller
    measures every head for the first `all_samples` samples and the `top` best for the others
    (`explorer_heads`)."""
    from corelens.report.overlay import panels, token_grid  # matplotlib and PIL: only when writing

    arrays, meta = {}, []
    for i, (sample, prepared, chosen, maps) in enumerate(measured):
        panel = panels(sample, prepared, max_panels=1)[0]
        grids, parts = [], []
        for head in chosen:
            grid = token_grid(panel.segment, maps[head])
            grids.append(pool(grid / (grid.sum() or 1.0)))
            parts.append(grid.sum())
        stack = np.stack(grids)
        scale = stack.max(axis=(1, 2))
        arrays[f"maps_{i}"] = np.round(255 * stack / np.where(scale > 0, scale, 1)[:, None, None]).astype(
            np.uint8
        )
        arrays[f"scale_{i}"] = scale.astype(np.float32)
        arrays[f"panel_{i}"] = np.asarray(parts, dtype=np.float32)
        arrays[f"heads_{i}"] = np.asarray(chosen, dtype=np.int16)
        xe, ye = panel.segment.cell_edges()
        meta.append(
            {
                "id": sample.id,
                "question": sample.question,
                "label": panel.label,
                "size": list(panel.segment.orig_size),
                "extent": [float(xe[0]), float(ye[0]), float(xe[-1]), float(ye[-1])],
                "boxes": [list(map(float, b)) for b in panel.boxes],
                "picture": _picture(panel),
            }
        )
    folder = Path(folder)
    with writer(folder / "explorer.npz", root=folder) as f:
        np.savez_compressed(f, **arrays)
    write_text(RANK.path(folder, "explorer"), json.dumps({"samples": meta, "top": top, "all_samples": all_samples}),
               root=folder)  # fmt: skip
    return folder / "explorer.npz", (folder / "explorer.npz").stat().st_size


def explorer_heads(heads: pd.DataFrame, samples: int, *, top: int = TOP, all_samples: int = ALL_SAMPLES):
    """Return, per stored sample, the heads the explorer keeps: every head (best first) for the first
    `all_samples`, the `top` best for the others."""
    ranked = heads.sort_values("rank")
    every = list(zip(ranked["layer"].astype(int), ranked["head"].astype(int)))
    return [every if i < all_samples else every[:top] for i in range(samples)]


def _short(value: float) -> float | None:
    """Return `value` to 5 significant digits (per-sample RAM of every head: the page's largest table)."""
    return None if pd.isna(value) else float(f"{value:.5g}")


def _number(value: float) -> float | None:
    """Return `value` as a JSON number, NaN (a head with no visual mass) as null."""
    return None if pd.isna(value) else float(value)


def _task(run: Path) -> dict | None:
    if not (run / "explorer.npz").is_file():  # rank run made with --explorer 0, or not a rank run
        return None
    meta = jsonfile.load(RANK.path(run, "explorer"), root=run)
    heads = read_heads(RANK.path(run, "heads"))  # every layer and head inside the grid the table lists
    ram = read_ram(RANK.path(run, "ram"))
    arrays = np.load(run / "explorer.npz")
    ram["name"] = "L" + ram["layer"].astype(str) + "H" + ram["head"].astype(str)
    values = ram[["mass", "share", "lift"]].astype(float).map(_short)
    per_sample = {
        sid: dict(zip(group["name"], values.loc[group.index].to_numpy().tolist()))
        for sid, group in ram.groupby("sample_id", sort=False)
    }
    samples = []
    for i, info in enumerate(meta["samples"]):
        maps = arrays[f"maps_{i}"]
        # Runs written before `panel_{i}` was stored: every head counted as all on the panel (maps as shares).
        part = arrays[f"panel_{i}"] if f"panel_{i}" in arrays else np.ones(len(maps), dtype=np.float32)
        samples.append(
            {
                **info,
                "heads": [f"L{layer}H{head}" for layer, head in arrays[f"heads_{i}"].tolist()],
                "shape": list(maps.shape[1:]),
                "scale": [_short(v) for v in arrays[f"scale_{i}"].astype(float)],
                "panel": [_short(v) for v in part.astype(float)],
                "maps": base64.b64encode(maps.tobytes()).decode("ascii"),
                "ram": per_sample.get(info["id"], {}),
            }
        )
    table = heads[["layer", "head", "mass", "share", "lift", "rank"]]
    return {
        "name": run.name,
        "layers": int(heads["layer"].max()) + 1,
        "heads": int(heads["head"].max()) + 1,
        "table": [
            [int(r.layer), int(r["head"]), _number(r.mass), _number(r.share), _number(r.lift), int(r["rank"])]
            for _, r in table.iterrows()
        ],
        "samples": samples,
    }


def explorer_data(runs: list[Path]) -> list[dict]:
    """Return the explorer's data of every rank run that stored maps."""
    return [t for t in (_task(r) for r in runs) if t is not None]


def explorer_section(scripts: Markup) -> Markup:
    """Return the explorer's HTML; `scripts`: the `<script>` elements that define `EXPLORER` (inline or a
    file) and then run `EXPLORER_JS`."""
    return Markup("""<section id='explorer'><h2>Head explorer</h2>
<p>The grid has one cell per head (layer 0 at the top); its number is the head's <strong>rank</strong> by mean
RAM (1 = most attention on the target) and its colour the mean RAM. The task's top head is shown on load and on
its tab; click a head to see the cells it attends on each stored sample (8 per page), outlined on the picture;
tick “compare” to fill panel B. Search a head by name, e.g. L1H2.</p>
<div id='tasks'></div>
<p><input id='head-search' placeholder='L0H1' size='8'> <button id='head-go'>show</button>
<label><input type='checkbox' id='compare'> compare (panel B)</label>
<span id='search-error'></span></p>
<div id='grid-legend' class='legend'></div>
<div id='grid'></div>
<div id='map-legend' class='legend'></div>
<div class='panels'><div id='panel-a' class='panel'></div><div id='panel-b' class='panel'></div></div>
<h3>Sample picker</h3><select id='sample-picker'></select><div id='sample-heads'></div>
{}</section>""").format(scripts)


# Inside a <script> element only `</script` and `<!--` are markup; escaping every `<`, `>` and `&` in the JSON
# leaves neither, whatever a sample id or question holds. U+2028 / U+2029 end a line in older JavaScript.
_SCRIPT_SAFE = {
    ord("<"): "\\u003c",
    ord(">"): "\\u003e",
    ord("&"): "\\u0026",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def data_script(tasks: list[dict]) -> str:
    """Return the JavaScript that defines `EXPLORER`, safe to inline in a `<script>` element."""
    return "var EXPLORER = " + json.dumps(tasks, allow_nan=False).translate(_SCRIPT_SAFE) + ";"


STYLE = """
#grid { overflow-x: auto; } #grid table { margin: 0.3em 0; }
#grid table td.cell { min-width: 28px; height: 24px; cursor: pointer; font-size: 13px; text-align: center; }
#grid td.sel-a { outline: 3px solid #06c; } #grid td.sel-b { outline: 3px solid #c60; }
.legend { font-size: 0.85em; color: #333; margin: 0.3em 0; } .legend canvas { vertical-align: middle; margin: 0 0.4em; }
.panels { display: flex; gap: 1em; } .panel { flex: 1; min-width: 0; }
.panel canvas { border: 1px solid #ddd; } .panel figure { margin: 0.3em; }
.panel figcaption { max-width: 160px; overflow-wrap: anywhere; }
.pager button { margin: 0 0.3em; } .pager { font-size: 0.85em; }
#tasks button.on { font-weight: 700; } #search-error { color: #b00; }
"""

EXPLORER_JS = r"""
(function () {
  // PAGE samples per page of a head's panel: with 160 px maps a panel stays within one screen.
  var PAGE = 8, task = 0, picked = {a: null, b: null}, pages = {a: 0, b: 0};
  // Grid colour: white (lowest mean RAM of the task) to HOT (highest), opaque so the text colour can be
  // chosen for contrast: black or white, whichever is farther from the cell's luminance (WCAG AA, >= 4.5:1).
  var HOT = [200, 40, 0];
  // Maps: the picture keeps its own colours; a cell is outlined (yellow, on a dark halo where cells are large
  // enough) with a weight and opacity that grow with its share of the head's whole attention, over the
  // sample's largest such share of any stored head; cells under FLOOR of it are not outlined.
  var FLOOR = 0.1, OUTLINE = '#ffd400';
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function fmt(v) { return v === null || v === undefined ? '—' : Number(v).toPrecision(4); }
  function pct(v) { return v === null || v === undefined ? '—' : (100 * v).toFixed(1) + ' %'; }
  function times(v) { return v === null || v === undefined ? '—' : Number(v).toFixed(2) + '×'; }
  function bytes(b64) {
    var s = atob(b64), out = new Uint8Array(s.length);
    for (var i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
    return out;
  }
  function row(name) {
    var t = EXPLORER[task];
    return t.table.filter(function (r) { return 'L' + r[0] + 'H' + r[1] === name; })[0];
  }
  function heat(v) { return HOT.map(function (c) { return Math.round(255 + (c - 255) * v); }); }
  function luminance(rgb) {
    var c = rgb.map(function (x) { x /= 255; return x <= 0.03928 ? x / 12.92 : Math.pow((x + 0.055) / 1.055, 2.4); });
    return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
  }
  function ink(rgb) { return luminance(rgb) > 0.179 ? '#000000' : '#ffffff'; }  // 0.179: equal contrast
  function bar(stops, width) {
    var c = el('canvas', {width: width || 160, height: 12}), ctx = c.getContext('2d');
    var g = ctx.createLinearGradient(0, 0, c.width, 0);
    stops.forEach(function (s) { g.addColorStop(s[0], s[1]); });
    ctx.fillStyle = g; ctx.fillRect(0, 0, c.width, c.height);
    return c;
  }
  function drawLegends() {
    var grid = document.getElementById('grid-legend'), maps = document.getElementById('map-legend');
    grid.innerHTML = ''; maps.innerHTML = '';
    grid.appendChild(document.createTextNode('Grid: number = rank by mean RAM (1 = highest); colour = mean RAM, lowest'));
    grid.appendChild(bar([[0, 'rgb(' + heat(0) + ')'], [1, 'rgb(' + heat(1) + ')']]));
    grid.appendChild(document.createTextNode('highest of this task.'));
    maps.appendChild(document.createTextNode('Maps: the picture in its own colours; outlined cells: where the head looks, the line'));
    var key = el('canvas', {width: 160, height: 24}), kx = key.getContext('2d');
    kx.fillStyle = '#777'; kx.fillRect(0, 0, key.width, key.height);
    [FLOOR, 0.5, 1].forEach(function (v, i) { outline(kx, 8 + 52 * i, 2, 20, 20, v); });
    maps.appendChild(key);
    maps.appendChild(document.createTextNode('heavier with the cell\u2019s share of the head\u2019s whole attention (one scale for every head of a sample: the heaviest is its largest share of any head; none under ' + (100 * FLOOR) + ' % of it), so a head that looks at the text shows no outline; cyan: target box.'));
  }
  // Outline the cell (x, y, w, h) at level v in (0, 1]: lines inside its border band (at most a third of the
  // cell), the middle of the cell left as the picture is.
  function outline(ctx, x, y, w, h, v) {
    var band = Math.max(1, Math.floor(Math.min(w, h) / 3)), halo = band >= 3;
    var lw = Math.max(1, Math.round((halo ? band - 2 : band) * v)), a = 0.45 + 0.55 * v;
    function ring(width, colour) {
      var inset = (halo ? lw + 2 : lw) / 2;
      ctx.lineWidth = width; ctx.strokeStyle = colour;
      ctx.strokeRect(x + inset, y + inset, w - 2 * inset, h - 2 * inset);
    }
    ctx.save(); ctx.globalAlpha = a;
    if (halo) ring(lw + 2, '#000');
    ring(lw, OUTLINE);
    ctx.restore();
  }
  function drawMap(sample, index, canvas) {
    var img = new Image();
    img.onload = function () {
      var w = canvas.width, h = canvas.height, ctx = canvas.getContext('2d');
      ctx.drawImage(img, 0, 0, w, h);
      var rows = sample.shape[0], cols = sample.shape[1], all = sample._maps || (sample._maps = bytes(sample.maps));
      // A cell's share of the head's whole attention: its share of the panel x the head's part on the panel,
      // over the largest cell of any stored head of this sample (one scale: a null head draws nothing).
      var top = Math.max.apply(null, sample.scale.map(function (s, k) { return s * sample.panel[k]; }));
      var sx = w / sample.size[0], sy = h / sample.size[1], e = sample.extent;
      var cw = (e[2] - e[0]) * sx / cols, ch = (e[3] - e[1]) * sy / rows;
      for (var i = 0; i < rows * cols; i++) {
        var v = all[index * rows * cols + i] / 255 * sample.scale[index] * sample.panel[index] / (top || 1);
        if (top > 0 && v >= FLOOR) outline(ctx, e[0] * sx + (i % cols) * cw, e[1] * sy + Math.floor(i / cols) * ch, cw, ch, Math.min(1, v));
      }
      ctx.strokeStyle = 'cyan'; ctx.lineWidth = 2;
      sample.boxes.forEach(function (b) { ctx.strokeRect(b[0] * sx, b[1] * sy, (b[2] - b[0]) * sx, (b[3] - b[1]) * sy); });
      canvas.dataset.drawn = '1';
    };
    img.src = 'data:image/jpeg;base64,' + sample.picture;
  }
  function showHead(slot, name, keepPage) {
    var r = row(name), panel = document.getElementById('panel-' + slot);
    panel.innerHTML = '';
    if (!r) return false;
    if (!keepPage || picked[slot] !== name) pages[slot] = 0;
    picked[slot] = name;
    panel.appendChild(el('h3', {'class': 'head-label'}, (slot === 'a' ? 'A: ' : 'B: ') + name));
    var stats = el('p', {'class': 'stats'});
    stats.appendChild(el('span', {'class': 'ram', 'data-value': String(r[2])}, 'RAM ' + pct(r[2])));
    stats.appendChild(document.createTextNode(', share ' + pct(r[3]) + ', lift ' + times(r[4]) + '. Rank: '));
    stats.appendChild(document.createTextNode(EXPLORER.map(function (t) {
      var o = t.table.filter(function (x) { return 'L' + x[0] + 'H' + x[1] === name; })[0];
      return t.name + ' ' + (o ? o[5] + '/' + t.table.length : '—');
    }).join(', ')));
    panel.appendChild(stats);
    // This head's stored samples (past the first few, a sample stores only the top heads), one page of them.
    var shown = EXPLORER[task].samples.filter(function (s) { return s.heads.indexOf(name) >= 0; });
    var last = Math.max(0, Math.ceil(shown.length / PAGE) - 1), p = Math.min(pages[slot], last);
    pages[slot] = p;
    if (shown.length > PAGE) panel.appendChild(pager(slot, name, p, last, shown.length));
    shown.slice(p * PAGE, (p + 1) * PAGE).forEach(function (s) {
      var index = s.heads.indexOf(name);
      var fig = el('figure', {'class': 'overlay', 'data-head': name, 'data-sample': s.id});
      var scale = 160 / Math.max(s.size[0], s.size[1]);
      var canvas = el('canvas', {width: Math.round(s.size[0] * scale), height: Math.round(s.size[1] * scale)});
      fig.appendChild(canvas);
      var ram = s.ram[name] || [null, null, null];
      fig.appendChild(el('figcaption', {}, s.id + ': RAM ' + pct(ram[0]) + ', share ' + pct(ram[1]) + ', lift ' + times(ram[2]) + '; ' + pct(s.panel[index]) + ' of its attention on this picture'));
      panel.appendChild(fig);
      drawMap(s, index, canvas);
    });
    markGrid();
    return true;
  }
  function pager(slot, name, p, last, total) {
    var nav = el('p', {'class': 'pager'});
    var prev = el('button', {'class': 'prev'}, '‹ previous'), next = el('button', {'class': 'next'}, 'next ›');
    prev.disabled = p === 0; next.disabled = p === last;
    prev.addEventListener('click', function () { pages[slot] = p - 1; showHead(slot, name, true); });
    next.addEventListener('click', function () { pages[slot] = p + 1; showHead(slot, name, true); });
    nav.appendChild(prev);
    nav.appendChild(el('span', {'class': 'page'}, 'samples ' + (p * PAGE + 1) + '–' + Math.min(total, (p + 1) * PAGE) + ' of ' + total));
    nav.appendChild(next);
    return nav;
  }
  function markGrid() {
    document.querySelectorAll('#grid td.cell').forEach(function (td) {
      td.classList.toggle('sel-a', td.dataset.head === picked.a);
      td.classList.toggle('sel-b', td.dataset.head === picked.b);
    });
  }
  function pick(name) {
    var slot = document.getElementById('compare').checked ? 'b' : 'a';
    return showHead(slot, name);
  }
  function topHead() {
    var best = EXPLORER[task].table.slice().sort(function (x, y) { return x[5] - y[5]; })[0];
    return best ? 'L' + best[0] + 'H' + best[1] : null;
  }
  function drawGrid() {
    // Colour: mean RAM from the task's lowest (white) to its highest (HOT); number: the head's rank.
    var t = EXPLORER[task], grid = document.getElementById('grid'), top = -Infinity, low = Infinity;
    t.table.forEach(function (r) { if (r[2] !== null) { top = Math.max(top, r[2]); low = Math.min(low, r[2]); } });
    var table = el('table'), head = el('tr');
    table.appendChild(el('caption', {}, t.name + ': rank by mean RAM'));
    head.appendChild(el('th', {}, 'layer \\ head'));
    for (var h = 0; h < t.heads; h++) head.appendChild(el('th', {}, String(h)));
    table.appendChild(head);
    for (var l = 0; l < t.layers; l++) {
      var tr = el('tr');
      tr.appendChild(el('th', {}, 'L' + l));
      for (var k = 0; k < t.heads; k++) {
        var name = 'L' + l + 'H' + k, r = row(name);
        var v = r && r[2] !== null ? (r[2] - low) / ((top - low) || 1) : 0, rgb = heat(v);
        var td = el('td', {'class': 'cell', 'data-head': name, title: name + (r ? ' rank ' + r[5] : '')}, r ? String(r[5]) : '');
        td.style.backgroundColor = 'rgb(' + rgb.join(', ') + ')';
        td.style.color = ink(rgb);
        td.addEventListener('click', function (e) { pick(e.currentTarget.dataset.head); });
        tr.appendChild(td);
      }
      table.appendChild(tr);
    }
    grid.innerHTML = '';
    grid.appendChild(table);
    markGrid();
  }
  function drawPicker() {
    var select = document.getElementById('sample-picker');
    select.innerHTML = '';
    EXPLORER[task].samples.forEach(function (s, i) { select.appendChild(el('option', {value: i}, s.id)); });
    showSample();
  }
  function showSample() {
    var t = EXPLORER[task], s = t.samples[document.getElementById('sample-picker').value || 0], out = document.getElementById('sample-heads');
    out.innerHTML = '';
    if (!s) return;
    var names = Object.keys(s.ram).sort(function (x, y) { return s.ram[y][0] - s.ram[x][0]; });
    [['top', names.slice(0, 5)], ['bottom', names.slice(-5).reverse()]].forEach(function (pair) {
      var p = el('p', {'class': 'sample-' + pair[0]}, pair[0] + ' heads on ' + s.id + ' (RAM): ');
      pair[1].forEach(function (n) {
        var a = el('a', {href: '#explorer', 'data-head': n}, n + ' (' + pct(s.ram[n][0]) + ') ');
        a.addEventListener('click', function (e) { e.preventDefault(); pick(n); });
        p.appendChild(a);
      });
      out.appendChild(p);
    });
  }
  function drawTasks() {
    var box = document.getElementById('tasks');
    box.innerHTML = '';
    EXPLORER.forEach(function (t, i) {
      var b = el('button', {'class': i === task ? 'on' : '', 'data-task': t.name}, t.name);
      // A task's tab shows its own top head in A (B, a comparison, keeps its head where the task has it).
      b.addEventListener('click', function () { task = i; drawTasks(); drawGrid(); drawPicker();
        if (topHead()) showHead('a', topHead()); if (picked.b) showHead('b', picked.b); });
      box.appendChild(b);
    });
  }
  function search() {
    var text = document.getElementById('head-search').value.trim().toUpperCase(), m = /^L(\d+)H(\d+)$/.exec(text);
    var ok = m && pick('L' + Number(m[1]) + 'H' + Number(m[2]));
    document.getElementById('search-error').textContent = ok ? '' : 'no head ' + text + ' in ' + EXPLORER[task].name;
  }
  if (!EXPLORER.length) { document.getElementById('explorer').hidden = true; return; }
  document.getElementById('head-go').addEventListener('click', search);
  document.getElementById('head-search').addEventListener('keydown', function (e) { if (e.key === 'Enter') search(); });
  document.getElementById('sample-picker').addEventListener('change', showSample);
  drawLegends(); drawTasks(); drawGrid(); drawPicker();
  if (topHead()) showHead('a', topHead());  // the top head is shown on load
  document.body.dataset.explorer = 'ready';
})();
"""
