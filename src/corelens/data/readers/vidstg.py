"""VidSTG: the sentence annotations (`{split}_annotations.json`: `vid`, `fps`, `frame_count`, `width`,
`height`, `used_segment` / `temporal_gt` as `{begin_fid, end_fid}`, `captions` / `questions` with
`target_id` and `description`) and the VidOR object trajectories (`trajectories`: one list per frame of
`{tid, bbox: {xmin, ymin, xmax, ymax}}`, in the entry itself or in the VidOR annotation file `{vid}.json`),
with the videos as files (`{vid}.mp4`, decoded with PyAV) or as frame folders (`{vid}/`, one image per frame).

Frames are sampled at `fps` within the used segment (at most `max_frames`, evenly) and written as images;
each caption or question becomes one sample whose tube holds the sampled frames inside the temporal ground
truth where the target has a box.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from corelens.data.readers.common import Records, run_until_limit
from corelens.errors import InputError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def _segment(entry: dict, key: str, where: dict) -> tuple[int, int]:
    raw = entry.get(key)
    if not isinstance(raw, dict) or "begin_fid" not in raw or "end_fid" not in raw:
        raise InputError(f"{key} must be {{begin_fid, end_fid}}", **where, field=key)
    begin, end = int(raw["begin_fid"]), int(raw["end_fid"])
    if end < begin:
        raise InputError(f"{key} ends before it begins: {raw}", **where, field=key)
    return begin, end


def sampled_frames(begin: int, end: int, native_fps: float, fps: float, max_frames: int) -> list[int]:
    """Return the frame ids sampled at `fps` in [begin, end] (at most `max_frames`, evenly spread)."""
    step = native_fps / fps
    ids = sorted({int(round(begin + k * step)) for k in range(int((end - begin) / step) + 1)})
    ids = [i for i in ids if begin <= i <= end]
    if len(ids) > max_frames:
        ids = [ids[int(j)] for j in np.linspace(0, len(ids) - 1, max_frames).round()]
    return ids


def _trajectories(entry: dict, source: Path, where: dict) -> list:
    if isinstance(entry.get("trajectories"), list):
        return entry["trajectories"]
    hits = sorted(source.rglob(f"{entry['vid']}.json"))
    for hit in hits:
        data = json.loads(hit.read_text())
        if isinstance(data.get("trajectories"), list):
            return data["trajectories"]
    raise InputError(
        f"no trajectories for video {entry['vid']} (entry or VidOR {entry['vid']}.json)",
        **where,
        field="trajectories",
    )


def _frames(vid: str, source: Path, ids: list[int], folder: Path, where: dict) -> list[str]:
    """Write the frames `ids` of video `vid` into `folder`; return their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {fid: folder / f"{fid:06d}.jpg" for fid in ids}
    if all(p.is_file() for p in wanted.values()):
        return [str(wanted[f]) for f in ids]
    from PIL import Image

    frame_dir = next((d for d in source.rglob(vid) if d.is_dir()), None)
    video = next(iter(sorted(source.rglob(f"{vid}.mp4"))), None)
    if frame_dir is not None:
        files = sorted(p for p in frame_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        for fid, path in wanted.items():
            if fid >= len(files):
                raise InputError(
                    f"frame {fid} is beyond the {len(files)} frames in {frame_dir}",
                    **where,
                    field="frame_count",
                )
            Image.open(files[fid]).convert("RGB").save(path, quality=95)
    elif video is not None:
        import av

        with av.open(str(video)) as container:
            for fid, frame in enumerate(container.decode(video=0)):
                if fid in wanted:
                    frame.to_image().convert("RGB").save(wanted[fid], quality=95)
                if fid >= ids[-1]:
                    break
        missing = [f for f, p in wanted.items() if not p.is_file()]
        if missing:
            raise InputError(f"{video} has no frame {missing[0]}", **where, field="frame_count")
    else:
        raise InputError(
            f"no video {vid}.mp4 and no frame folder {vid}/ under {source}", **where, field="vid"
        )
    return [str(wanted[f]) for f in ids]


def _convert(source: Path, out: Path, records: Records, split: str, fps: float, max_frames: int) -> None:
    names = [f"{split}_annotations.json"] if split else []
    path = (
        next((p for name in names for p in sorted(source.rglob(name))), None) if source.is_dir() else source
    )
    if path is None:
        raise InputError(f"{split}_annotations.json not found", file=str(source))
    try:
        entries = json.loads(path.read_text())
    except ValueError as exc:
        raise InputError(f"invalid JSON: {exc}", file=str(path)) from None
    root = source if source.is_dir() else source.parent
    for i, entry in enumerate(entries):
        where = {
            "file": str(path),
            "line": i + 1,
            "sample": str(entry.get("vid")) if isinstance(entry, dict) else None,
        }
        with records.guard(where):
            for key in ("vid", "fps", "width", "height"):
                if not isinstance(entry, dict) or key not in entry:
                    raise InputError(f"missing {key!r}", **where, field=key)
            used = _segment(entry, "used_segment", where)
            truth = _segment(entry, "temporal_gt", where)
            ids = sampled_frames(*used, float(entry["fps"]), fps, max_frames)
            trajectories = _trajectories(entry, root, where)
            frames = _frames(str(entry["vid"]), root, ids, out / "frames" / str(entry["vid"]), where)
            sentences = [("caption", c) for c in entry.get("captions", [])] + [
                ("question", q) for q in entry.get("questions", [])
            ]
            for s, (kind, item) in enumerate(sentences):
                target, text = item.get("target_id"), item.get("description")
                if target is None or not text:
                    raise InputError(f"{kind} {s} needs target_id and description", **where, field=f"{kind}s")
                tube_frames, boxes = [], []
                for k, fid in enumerate(ids):
                    if not truth[0] <= fid <= truth[1] or fid >= len(trajectories):
                        continue
                    for obj in trajectories[fid]:
                        if obj.get("tid") == target:
                            b = obj["bbox"]
                            tube_frames.append(k)
                            boxes.append(
                                [float(b["xmin"]), float(b["ymin"]), float(b["xmax"]), float(b["ymax"])]
                            )
                if not tube_frames:
                    raise InputError(
                        f"{kind} {s}: the target has no box in the sampled ground-truth frames",
                        **where,
                        field="temporal_gt",
                    )
                records.add(
                    {
                        "id": f"vidstg-{entry['vid']}-{kind}-{s}",
                        "task": "video",
                        "video": {"frames": frames, "fps": fps},
                        "question": str(text).strip(),
                        "targets": [{"frames": tube_frames, "boxes": boxes}],
                        "sentence_type": item.get("type", kind),
                        "frame_ids": ids,
                    }
                )


def convert(
    source: Path,
    out: Path,
    *,
    skip_bad: bool = False,
    split: str = "test",
    fps: float = 2.0,
    max_frames: int = 32,
    limit: int | None = None,
):
    """Convert VidSTG at `source` into `out/vidstg.jsonl` plus the sampled frames."""
    records = Records(skip_bad, limit)
    run_until_limit(_convert, source, out, records, split, fps, max_frames)
    return records.write(out / "vidstg.jsonl")
