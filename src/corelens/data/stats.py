"""`corelens data stats`: what a sample file, a converted dataset or a run holds, before a long run.

Per dataset (the readers' `dataset` field, else the task): samples, samples without an evidence target,
records skipped and why (from `skipped.jsonl` beside a converted file, or a run's `samples.jsonl`), pages or
frames per sample, targets per sample, and with a model the prompt's token count, its visual tokens and
the share of the visual tokens that fall in Ω, computed through the checkpoint's own processor (the weights
are not loaded).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from corelens.data import jsonfile
from corelens.data.sample import Sample, read_samples
from corelens.errors import CorelensError, InputError

MANIFEST = "manifest.json"


def locate(target: str | Path) -> tuple[Path, list[dict], Path]:
    """Return (sample file, skipped records with their reasons, where to write the statistics) of `target`.

    `target`: a run folder (its manifest names the sample file; its `samples.jsonl` lists the samples the run
    skipped), a converted dataset folder (one `*.jsonl` plus `skipped.jsonl`), a sample file, or NAME:PATH.
    """
    from corelens.data.readers import parse_spec, resolve

    if parse_spec(str(target)) is not None:
        path = resolve(str(target))
        return path, _read_jsonl(path.parent / "skipped.jsonl"), path.parent / "data_stats.json"
    target = Path(target)
    if not target.exists():
        raise CorelensError(f"{target} does not exist")
    if target.is_dir() and (target / MANIFEST).is_file():
        manifest = jsonfile.load(target / MANIFEST, root=target)
        data = (manifest.get("settings") or {}).get("data") or manifest.get("data")
        if not data:
            raise CorelensError(f"{target / MANIFEST} names no sample file")
        data = Path(data)
        skipped = [r for r in _read_jsonl(target / "samples.jsonl") if r.get("status") == "skipped"]
        return data, _read_jsonl(data.parent / "skipped.jsonl") + skipped, target / "data_stats.json"
    if target.is_dir():
        files = sorted(p for p in target.glob("*.jsonl") if p.name not in ("skipped.jsonl", "samples.jsonl"))
        if len(files) != 1:
            raise CorelensError(
                f"{target}: expected one sample file (*.jsonl), found {[p.name for p in files]}"
            )
        return files[0], _read_jsonl(target / "skipped.jsonl"), target / "data_stats.json"
    return target, _read_jsonl(target.parent / "skipped.jsonl"), target.with_suffix(".stats.json")


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [
        jsonfile.loads(line, f"{path}:{i}")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if line.strip()
    ]


def _dataset(sample: Sample) -> str:
    return str(sample.meta.get("dataset") or sample.task)


def _visuals(sample: Sample) -> tuple[str, int]:
    """("frames", n) for a video sample, ("pages", n) for a document, else ("images", n)."""
    if sample.video is not None:
        count = len(sample.video.frames) if sample.video.frames is not None else sample.video.max_frames
        return "frames", int(count or 0)
    return ("pages" if sample.task == "document" else "images"), len(sample.images)


def _summary(values: list[float]) -> dict | None:
    if not values:
        return None
    a = np.asarray(values, dtype=float)
    return {
        "min": float(a.min()),
        "median": float(np.median(a)),
        "mean": round(float(a.mean()), 3),
        "max": float(a.max()),
        "total": float(a.sum()),
    }


def stats(
    target: str | Path,
    tokens: Callable[[Sample], dict] | None = None,
    *,
    model: str | Path | None = None,
) -> dict:
    """Per-dataset counts of `target` (see the module docstring).

    `tokens(sample)` adds a model's token counts (`prompt_tokens`, `visual_tokens`, `omega_tokens`,
    `omega_share`; `corelens.models.prepare.token_counter`), `model` names that model in the result. The
    counting is passed in because it needs a model's processor, from a layer above this one.
    """
    path, skipped, _ = locate(target)
    samples, bad = read_samples(path, skip_bad=True)
    rows = []
    for s in samples:
        kind, count = _visuals(s)
        row = {"id": s.id, "dataset": _dataset(s), kind: count, "targets": len(s.targets)}
        if tokens is not None:
            try:
                row.update(tokens(s))
            except InputError as err:
                row["error"] = str(err)
        rows.append(row)
    reasons: dict[str, Counter] = defaultdict(Counter)
    for r in skipped:
        reasons[str(r.get("dataset") or _from_id(r))][str(r.get("reason") or r.get("error"))] += 1
    for b in bad:
        reasons["(unreadable records)"][b.error] += 1
    datasets = sorted({r["dataset"] for r in rows} | set(reasons))
    out = {"source": str(path), "model": str(model) if model else None, "datasets": {}}
    for name in datasets:
        mine = [r for r in rows if r["dataset"] == name]
        entry = {
            "samples": len(mine),
            "without_target": sum(1 for r in mine if not r["targets"]),
            "skipped": sum(reasons[name].values()),
            "skipped_reasons": dict(reasons[name].most_common()),
            "targets_per_sample": _summary([r["targets"] for r in mine]),
        }
        for kind in ("pages", "frames", "images"):
            values = [r[kind] for r in mine if kind in r]
            if values:
                entry[f"{kind}_per_sample"] = _summary(values)
        if tokens is not None:
            for key in ("prompt_tokens", "visual_tokens", "omega_tokens", "omega_share"):
                entry[key] = _summary([r[key] for r in mine if r.get(key) is not None])
            entry["errors"] = sum(1 for r in mine if "error" in r)
        out["datasets"][name] = entry
    out["samples"] = rows
    return out


def _from_id(record: dict) -> str:
    """Guess a skipped record's dataset from its sample id (`vidstg-...`) or its file."""
    from corelens.data.readers import READER_NAMES

    text = f"{record.get('sample') or record.get('id') or ''} {record.get('file') or ''}"
    for name in READER_NAMES:
        if name in text.lower():
            return name
    return "(unknown)"


def render(result: dict) -> str:
    """A plain-text table of `stats()` for the terminal."""
    lines = [f"source: {result['source']}" + (f"   model: {result['model']}" if result["model"] else "")]
    for name, e in result["datasets"].items():
        lines.append(
            f"\n{name}: {e['samples']} samples ({e['without_target']} without a target), {e['skipped']} skipped"
        )
        for reason, n in e["skipped_reasons"].items():
            lines.append(f"  skipped {n:>5} x {reason}")
        for key in ("pages_per_sample", "frames_per_sample", "images_per_sample", "targets_per_sample",
                    "prompt_tokens", "visual_tokens", "omega_tokens", "omega_share"):  # fmt: skip
            v = e.get(key)
            if v:
                total = f"   total {v['total']:.0f}" if key == "prompt_tokens" else ""
                lines.append(
                    f"  {key:<18} min {v['min']:.4g}   median {v['median']:.4g}   mean {v['mean']:.4g}"
                    f"   max {v['max']:.4g}{total}"
                )
        if e.get("errors"):
            lines.append(f"  {e['errors']} sample(s) could not be laid out (listed in the JSON)")
    return "\n".join(lines)
