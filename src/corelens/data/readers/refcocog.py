"""RefCOCOg: the original release (`refs(umd).p` + `instances.json`, COCO train2014 images) or the parquet
layout of dataset hubs (columns `question_id`, `image`, `answer` = the expressions, `bbox`, `file_name`).

One sample per referring expression (sentence): the question is the expression (through `template`), the
target is the referred object's box (COCO `[x, y, w, h]` -> `[x0, y0, x1, y1]`), the task `image`. A box
that extends past its image (size from `instances.json`, or the stored image in the parquet layout) is
clipped and the clip recorded in `meta.clipped`; a box empty once clipped is skipped with its reason.

The refs pickle is read by a restricted unpickler that admits only what the format holds (lists, dicts,
strings, numbers, None): a pickle that names any class or function is refused before anything runs, the
approach of `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

from corelens.data.paths import inside, safe_name
from corelens.data.readers.common import (
    Records,
    clip_box,
    find_one,
    number,
    read_json,
    reader,
    run_until_limit,
)
from corelens.errors import InputError

TEMPLATE = "{expression}"


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain containers, strings and numbers only; any global (class, function) is refused."""

    def find_class(self, module: str, name: str):
        # Every way a pickle can call code (REDUCE, BUILD, INST, OBJ, NEWOBJ) first fetches a global here.
        raise pickle.UnpicklingError(f"the refs pickle names {module}.{name}; only plain data is allowed")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("the refs pickle holds a persistent id; only plain data is allowed")


def load_refs(path: Path) -> list:
    """Read a `refer` refs pickle safely (plain data only); raise InputError naming the file otherwise."""
    try:
        with open(path, "rb") as handle:
            # encoding: the release was written by Python 2, whose byte strings hold the text.
            refs = _PlainUnpickler(handle, encoding="utf-8").load()
    except Exception as exc:  # a damaged or hostile pickle fails in many ways; none may escape as a crash
        raise InputError(f"cannot read the refs pickle: {exc}", file=str(path)) from None
    if not isinstance(refs, list):
        raise InputError(f"the refs pickle must hold a list, got {type(refs).__name__}", file=str(path))
    return refs


def _box(raw, where: dict) -> list[float]:
    if not isinstance(raw, (list, tuple)) or len(raw) != 4:
        raise InputError(f"bbox must be [x, y, w, h], got {raw!r}", **where, field="bbox")
    x, y, w, h = (number(v, where, "bbox") for v in raw)
    if w <= 0 or h <= 0:
        raise InputError(f"bbox has no area: {raw!r}", **where, field="bbox")
    return [x, y, x + w, y + h]


def _clipped(box: list[float], size) -> tuple[list[float] | None, dict | None]:
    """Clip a box to its image when the size is known: (box or None if empty, the clip made or None)."""
    width, height = size
    if not width or not height:
        return box, None
    clipped, changed = clip_box(box, float(width), float(height))
    return clipped, ({"box": box, "clipped": clipped, "image_size": [width, height]} if changed else None)


def _original(
    source: Path, out: Path, records: Records, split: str | None, template: str, images: Path | None
) -> None:
    refs_path = find_one(source, ["refs(umd).p", "refs(google).p", "refs.p"], "RefCOCOg refs pickle")
    inst_path = find_one(source, ["instances.json"], "RefCOCOg instances.json")
    refs = load_refs(refs_path)
    instances = read_json(inst_path)  # bounded; a repeated key or deep nesting is one line
    try:
        boxes = {a["id"]: a["bbox"] for a in instances["annotations"]}
        files = {im["id"]: im["file_name"] for im in instances["images"]}
        sizes = {im["id"]: (im.get("width"), im.get("height")) for im in instances["images"]}
    except (KeyError, TypeError) as exc:
        raise InputError(f"not a COCO instances file: {exc}", file=str(inst_path)) from None
    folder = images or next(
        (
            p
            for p in (
                source / "images",
                source / "train2014",
                source.parent / "images/mscoco/images/train2014",
            )
            if p.is_dir()
        ),
        source / "images",
    )
    for i, ref in enumerate(refs):
        where = {
            "file": str(refs_path),
            "line": i + 1,
            "sample": str(ref.get("ref_id", i)) if isinstance(ref, dict) else str(i),
        }
        with records.guard(where):
            if not isinstance(ref, dict):
                raise InputError("a ref must be a dict", **where)
            if split is not None and ref.get("split") != split:
                continue
            for key in ("ref_id", "ann_id", "image_id", "sentences"):
                if key not in ref:
                    raise InputError(f"missing {key!r}", **where, field=key)
            if ref["ann_id"] not in boxes:
                raise InputError(
                    f"annotation {ref['ann_id']} is not in {inst_path.name}", **where, field="ann_id"
                )
            if ref["image_id"] not in files:
                raise InputError(
                    f"image {ref['image_id']} is not in {inst_path.name}", **where, field="image_id"
                )
            box, clipped = _clipped(_box(boxes[ref["ann_id"]], where), sizes[ref["image_id"]])
            if box is None:
                records.skip(
                    where, f"the COCO bbox {boxes[ref['ann_id']]} is empty once clipped to its image"
                )
                continue
            image = folder / files[ref["image_id"]]
            for s, sentence in enumerate(ref["sentences"]):
                text = sentence.get("sent") or sentence.get("raw") if isinstance(sentence, dict) else None
                if not text:
                    raise InputError(f"sentence {s} has no text", **where, field="sentences")
                records.add(
                    {
                        "id": f"refcocog-{ref['ref_id']}-{sentence.get('sent_id', s)}",
                        "task": "image",
                        "images": [str(image)],
                        "question": template.format(expression=text.strip()),
                        "targets": [{"image": 0, "box": box}],
                        "dataset": "refcocog",
                        "meta": {
                            "split": ref.get("split"),
                            "ref_id": ref["ref_id"],
                            "ann_id": ref["ann_id"],
                            "category_id": ref.get("category_id"),
                            **({"clipped": clipped} if clipped else {}),
                        },
                    }
                )


def _parquet(source: Path, out: Path, records: Records, template: str) -> None:
    import pandas as pd

    files = [source] if source.is_file() else sorted(source.rglob("*.parquet"))
    if not files:
        raise InputError("no parquet files found", file=str(source))
    (out / "images").mkdir(parents=True, exist_ok=True)
    for path in files:
        frame = pd.read_parquet(path)
        for column in ("image", "answer", "bbox"):
            if column not in frame.columns:
                raise InputError(f"missing column {column!r}", file=str(path), field=column)
        for row_number, row in enumerate(frame.itertuples(index=False), start=1):
            qid = str(getattr(row, "question_id", row_number))
            where = {"file": str(path), "line": row_number, "sample": qid}
            with records.guard(where):
                box = _box(list(row.bbox) if row.bbox is not None else None, where)
                image = row.image.get("bytes") if isinstance(row.image, dict) else row.image
                if not isinstance(image, (bytes, bytearray)):
                    raise InputError("image has no bytes", **where, field="image")
                from PIL import Image

                # The question id names the PNG: mapped to a safe, collision-free name under out/images.
                name = inside(out, out / "images" / f"{safe_name(qid)}.png")
                picture = Image.open(io.BytesIO(image)).convert("RGB")
                picture.save(name)
                box, clipped = _clipped(box, picture.size)
                if box is None:
                    records.skip(where, f"the COCO bbox {list(row.bbox)} is empty once clipped to its image")
                    continue
                expressions = [row.answer] if isinstance(row.answer, str) else list(row.answer)
                for s, text in enumerate(expressions):
                    records.add(
                        {
                            "id": f"refcocog-{qid}-{s}",
                            "task": "image",
                            "images": [str(name)],
                            "question": template.format(expression=str(text).strip()),
                            "targets": [{"image": 0, "box": box}],
                            "dataset": "refcocog",
                            "meta": {"clipped": clipped} if clipped else None,
                        }
                    )


@reader
def convert(
    source: Path,
    out: Path,
    *,
    skip_bad: bool = False,
    split: str | None = "val",
    template: str = TEMPLATE,
    images: str | Path | None = None,
    limit: int | None = None,
):
    """Convert RefCOCOg at `source` (a release folder, or parquet file(s)) into `out/refcocog.jsonl`."""
    records = Records(skip_bad, limit)
    parquet = source.suffix == ".parquet" or (source.is_dir() and any(source.rglob("*.parquet")))
    if parquet:
        run_until_limit(_parquet, source, out, records, template)
    else:
        run_until_limit(_original, source, out, records, split, template, Path(images) if images else None)
    return records.write(out / "refcocog.jsonl")
