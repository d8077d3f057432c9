"""VidSTG: the sentence annotations (`{split}_annotations.json`: `vid`, `fps`, `frame_count`, `width`,
`height`, `used_segment` / `temporal_gt` as `{begin_fid, end_fid}`, `captions` / `questions` with
`target_id` and `description`) and the VidOR object trajectories (`trajectories`: one list per frame of
`{tid, bbox: {xmin, ymin, xmax, ymax}}`, in the entry itself or in the VidOR annotation file `{vid}.json`),
with the videos as files (`{vid}.mp4`, decoded with PyAV) or as frame folders (`{vid}/`, one image per frame).

Frame ranges are half-open: `end_fid` is exclusive, as in VidOR's relation instances. In the published
test annotations `temporal_gt` equals `used_relation` in every entry, 768 of the 4,610 entries end at
`end_fid == frame_count` (a frame that does not exist), and VidSTG evaluation code (TubeDETR's
`vidstg_eval.py`) keeps the frames `begin_fid <= f < end_fid` of both ranges.

Frames are sampled at `fps` within the used segment (at most `max_frames`, evenly) and written as images;
each caption or question becomes one sample (id `vidstg-{vid}-{entry index}-{caption|question}-{k}`: a video
has one entry per annotated relation instance, so the entry index keeps ids unique) whose tube holds the
sampled frames inside the temporal ground truth where the target has a box. Boxes are clipped to the frame
(recorded under `clipped`); a frame whose box is empty once clipped, or where the target has no box, is left
out of the tube (`dropped_frames`, with the reason); a sentence with no box left is skipped with its reason.
"""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np

from corelens.data.paths import inside, safe_name
from corelens.data.readers.common import (
    Records,
    clip_box,
    number,
    read_json,
    read_json_list,
    reader,
    run_until_limit,
)
from corelens.errors import InputError, OptionError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


# Bounds on an entry's rates and ranges (docs/methods.md#resource-limits): VidOR videos run at about 30 fps
# for under 3 minutes; these leave wide room and still end a crafted `fps: 1e-9` or `[0, 1e12)` at once.
MIN_FPS, MAX_FPS = 0.01, 1000.0
MAX_SEGMENT_FRAMES = 10_000_000  # about 4 days at 30 fps


def _segment(entry: dict, key: str, where: dict) -> tuple[int, int]:
    """Return `(begin, end)` of a VidSTG frame range; `end` is exclusive (see the module docstring)."""
    raw = entry.get(key)
    if not isinstance(raw, dict) or "begin_fid" not in raw or "end_fid" not in raw:
        raise InputError(f"{key} must be {{begin_fid, end_fid}}", **where, field=key)
    begin, end = raw["begin_fid"], raw["end_fid"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (begin, end)):
        raise InputError(f"{key} frame ids must be integers, got {raw}", **where, field=key)
    if end <= begin:
        raise InputError(f"{key} is empty or ends before it begins: {raw}", **where, field=key)
    if begin < 0 or end - begin > MAX_SEGMENT_FRAMES:
        # Frame ids index the video; a range beyond any real video only costs time and memory.
        raise InputError(
            f"{key} {raw} must start at frame >= 0 and span at most {MAX_SEGMENT_FRAMES:,} frames",
            **where,
            field=key,
        )
    return begin, end


def _rate(value: object, where: dict, field: str) -> float:
    """Return a frame rate that is a finite number in [MIN_FPS, MAX_FPS], else raise naming `field`."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not MIN_FPS <= float(value) <= MAX_FPS:  # NaN fails the comparison too
        raise InputError(
            f"{field} must be a number in [{MIN_FPS:g}, {MAX_FPS:g}], got {value!r}", **where, field=field
        )
    return float(value)


def sampled_frames(begin: int, end: int, native_fps: float, fps: float, max_frames: int) -> list[int]:
    """Return the frame ids sampled at `fps` in [begin, end), `end` exclusive (at most `max_frames`, evenly).

    Grid point k is frame round(begin + k * native_fps / fps); only the kept points are computed, so the
    cost is `max_frames` whatever the segment's length or the rates.
    """
    step = native_fps / fps
    if step <= 1:
        # The grid is finer than the frames: every frame of the range is a grid point, once.
        count, frame = end - begin, lambda j: begin + j
    else:
        # Distinct points; the last one of k <= (end - begin) / step may round onto `end` itself.
        count = int((end - begin) / step) + 1
        while count > 0 and int(round(begin + (count - 1) * step)) >= end:
            count -= 1
        frame = lambda j: int(round(begin + j * step))  # noqa: E731
    if count <= max_frames:
        return [frame(j) for j in range(count)]
    return [frame(int(j)) for j in np.linspace(0, count - 1, max_frames).round()]


def _trajectories(entry: dict, source: Path, where: dict, cache: dict) -> list:
    """Return the VidOR trajectories of the entry's video: from the entry itself or from VidOR `{vid}.json`."""
    if isinstance(entry.get("trajectories"), list):
        return entry["trajectories"]
    vid = str(entry["vid"])
    if vid not in cache:
        # Many entries share a video (one per relation instance): read its VidOR file once.
        cache[vid] = None
        for hit in sorted(source.rglob(f"{glob.escape(vid)}.json")):
            data = read_json(hit)
            if isinstance(data, dict) and isinstance(data.get("trajectories"), list):
                cache[vid] = data["trajectories"]
                break
    if cache[vid] is None:
        raise InputError(
            f"no trajectories for video {vid} (entry or VidOR {vid}.json)", **where, field="trajectories"
        )
    return cache[vid]


def _frames(
    vid: str, source: Path, ids: list[int], folder: Path, where: dict, geometry: tuple[int, int, int | None]
) -> list[str]:
    """Write the frames `ids` of video `vid` into `folder` (`geometry`: width, height, frame count)."""
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {fid: folder / f"{fid:06d}.jpg" for fid in ids}
    from PIL import Image

    if all(p.is_file() for p in wanted.values()):
        return [str(wanted[f]) for f in ids]

    # The vid is matched literally (glob.escape): `*` or `[` in it must not match other videos.
    frame_dir = next((d for d in source.rglob(glob.escape(vid)) if d.is_dir()), None)
    video = next(iter(sorted(source.rglob(f"{glob.escape(vid)}.mp4"))), None)
    if frame_dir is not None:
        files = sorted(p for p in frame_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        count = geometry[2]
        if count is not None and len(files) != count:
            # Frame k of the annotation is the k-th file; a missing or extra file would shift every frame.
            raise InputError(
                f"{frame_dir} holds {len(files)} frames but the video has frame_count {count}",
                **where,
                field="frame_count",
            )
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
    with Image.open(wanted[ids[0]]) as first:
        size = first.size
    if size != (int(geometry[0]), int(geometry[1])):
        # Boxes are in the annotation's pixel frame; frames of another size would misplace every box.
        raise InputError(
            f"frames of video {vid} are {size[0]}x{size[1]} but the annotation says "
            f"{geometry[0]}x{geometry[1]}",
            **where,
            field="width",
        )
    return [str(wanted[f]) for f in ids]


def _tube(
    trajectories: list,
    target,
    ids: list[int],
    truth: tuple[int, int],
    size: tuple[float, float],
    where: dict,
) -> tuple[list[int], list[list[float]], list[dict], list[dict]]:
    """The target's boxes on the sampled frames inside the temporal ground truth [begin, end).

    Returns the tube's frame indices (into `ids`), its boxes clipped to the frame, the clips made and the
    frames left out with their reason.
    """
    frames, boxes, clipped, dropped = [], [], [], []
    for k, fid in enumerate(ids):
        if not truth[0] <= fid < truth[1]:  # end_fid is exclusive
            continue
        objects = trajectories[fid] if fid < len(trajectories) else []
        if not isinstance(objects, list):
            raise InputError(f"trajectories[{fid}] must be a list of objects", **where, field="trajectories")
        found = [o for o in objects if isinstance(o, dict) and o.get("tid") == target]
        if not found:
            dropped.append({"fid": fid, "reason": "the target has no box on this frame"})
            continue
        raw = _trajectory_box(found[0].get("bbox"), fid, where)
        box, changed = clip_box(raw, *size)
        if box is None:
            dropped.append({"fid": fid, "box": raw, "reason": "the box is empty once clipped to the frame"})
            continue
        if changed:
            clipped.append({"fid": fid, "box": raw, "clipped": box})
        frames.append(k)
        boxes.append(box)
    return frames, boxes, clipped, dropped


def _trajectory_box(b, fid: int, where: dict) -> list[float]:
    """Return a VidOR `{xmin, ymin, xmax, ymax}` box as numbers; raise InputError naming the frame otherwise."""
    keys = ("xmin", "ymin", "xmax", "ymax")
    if not isinstance(b, dict) or any(k not in b for k in keys):
        raise InputError(
            f"frame {fid}: bbox must be {{xmin, ymin, xmax, ymax}}", **where, field="trajectories"
        )
    return [number(b[k], where, f"trajectories[{fid}].bbox.{k}") for k in keys]


def _check_fields(entry: dict, where: dict) -> str:
    """Check the types of an entry's fields (numbers as numbers, no NaN, a vid naming one file); return the vid.

    Resource bounds (fps, segment length) are checked where the frames are sampled.
    """
    vid = entry["vid"]
    if isinstance(vid, bool) or not isinstance(vid, (str, int)) or str(vid) in ("", ".", ".."):
        raise InputError(f"vid must be a video name, got {vid!r}", **where, field="vid")
    if "/" in str(vid) or "\\" in str(vid):
        # The vid names a video file or frame folder under the source; a path would reach outside it.
        raise InputError(f"vid {vid!r} holds a path separator; it must name one video", **where, field="vid")
    number(entry["fps"], where, "fps")
    for key in ("width", "height"):
        number(entry[key], where, key, integer=True)
    if entry.get("frame_count") is not None:
        number(entry["frame_count"], where, "frame_count", integer=True)
    for key in ("used_segment", "temporal_gt"):
        raw = entry.get(key)
        for end in ("begin_fid", "end_fid"):
            if isinstance(raw, dict) and end in raw:
                number(raw[end], where, f"{key}.{end}", integer=True)
    return str(vid)


def _convert(source: Path, out: Path, records: Records, split: str, fps: float, max_frames: int) -> None:
    names = [f"{split}_annotations.json"] if split else []
    path = (
        next((p for name in names for p in sorted(source.rglob(name))), None) if source.is_dir() else source
    )
    if path is None:
        raise InputError(f"{split}_annotations.json not found", file=str(source))
    entries = read_json_list(path, "the annotation file must hold a list of entries")
    root = source if source.is_dir() else source.parent
    cache: dict = {}
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
            vid = _check_fields(entry, where)
            used = _segment(entry, "used_segment", where)
            truth = _segment(entry, "temporal_gt", where)
            ids = sampled_frames(*used, _rate(entry["fps"], where, "fps"), fps, max_frames)
            if not ids:
                raise InputError(f"no frame sampled in used_segment {used}", **where, field="used_segment")
            trajectories = _trajectories(entry, root, where, cache)
            frame_count = int(entry["frame_count"]) if entry.get("frame_count") is not None else None
            frames = _frames(
                vid,
                root,
                ids,
                inside(out, out / "frames" / safe_name(vid)),  # the vid names the folder: a safe name
                where,
                (int(entry["width"]), int(entry["height"]), frame_count),
            )
            size = (float(entry["width"]), float(entry["height"]))
            sentences = [("caption", c) for c in entry.get("captions") or []] + [
                ("question", q) for q in entry.get("questions") or []
            ]
            for s, (kind, item) in enumerate(sentences):
                # The entry index makes the id unique: a video has one entry per annotated relation
                # instance, and the same sentence can describe several of them.
                sid = f"vidstg-{entry['vid']}-{i}-{kind}-{s}"
                swhere = {**where, "sample": sid}
                if not isinstance(item, dict) or item.get("target_id") is None or not item.get("description"):
                    raise InputError(
                        f"{kind} {s} needs target_id and description", **swhere, field=f"{kind}s"
                    )
                tube_frames, boxes, clipped, dropped = _tube(
                    trajectories, item["target_id"], ids, truth, size, swhere
                )
                if not tube_frames:
                    records.skip(
                        swhere, "the target has no box on any sampled frame of temporal_gt (Ω would be empty)"
                    )
                    continue
                records.add(
                    {
                        "id": sid,
                        "task": "video",
                        "video": {"frames": frames, "fps": fps},
                        "question": str(item["description"]).strip(),
                        "targets": [{"frames": tube_frames, "boxes": boxes}],
                        "dataset": "vidstg",
                        "vid": str(entry["vid"]),
                        "entry": i,
                        "sentence_type": item.get("type", kind),
                        "target_id": item["target_id"],
                        "frame_ids": ids,
                        "temporal_gt": list(truth),
                        "clipped": clipped or None,
                        "dropped_frames": dropped or None,
                    }
                )


@reader
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
    if not (isinstance(fps, (int, float)) and MIN_FPS <= fps <= MAX_FPS):  # NaN fails too
        raise OptionError(f"vidstg fps must be in [{MIN_FPS:g}, {MAX_FPS:g}], got {fps!r}")
    if not isinstance(max_frames, int) or not 0 < max_frames <= MAX_SEGMENT_FRAMES:
        raise OptionError(f"vidstg max_frames must be a positive integer, got {max_frames!r}")
    records = Records(skip_bad, limit)
    run_until_limit(_convert, source, out, records, split, fps, max_frames)
    return records.write(out / "vidstg.jsonl")
