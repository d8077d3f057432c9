"""MMDocIR (evaluation set): `MMDocIR_annotations.jsonl` (one document per line: `doc_name`, `domain`,
`page_indices` = [start, end] rows of the pages parquet, both included, `questions` with `Q`, `A`, `type`,
`page_id` (0-based pages of the document) and `layout_mapping` items `{page, page_size: [w, h],
bbox: [x1, y1, x2, y2]}` in `page_size` units) and `MMDocIR_pages.parquet` (`doc_name`, `passage_id`,
`image_binary`, ...), as the dataset card describes.

A document's pages are the parquet rows `page_indices`; a parquet holding only some documents (a subset
someone filtered) is read by `doc_name` instead, in its row order, and must hold the document's page count.

One sample per question. Pages shown: at most `max_pages`, chosen by `pages` ("window", default: the pages
around the evidence, every evidence page included; "first"; "all"), their 1-based page numbers recorded in
`pages`. Targets (`level`): "auto" (default) the layout boxes wherever the question has layout evidence and
its evidence pages otherwise, recorded per sample in `omega`; "layout"; "page"; "both" (pages and boxes: Ω is
then their union, the whole page). Layout boxes are clipped to their page (recorded in `clipped`) and scaled
from `page_size` to the stored page image; a box empty once clipped is left out with its reason
(`dropped_boxes`). A question without any evidence is kept without a target for the scoring commands.
"""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image

from corelens.data.paths import inside, safe_name
from corelens.data.readers.common import (
    PAGE_MODES,
    Records,
    clip_box,
    find_one,
    number,
    parse_json,
    read_lines,
    reader,
    run_until_limit,
    shown_pages,
)
from corelens.errors import InputError

LEVELS = ("auto", "page", "layout", "both")


class _Document:
    """The page rows of one document; page images are written on first use (the stored bytes, unchanged)."""

    def __init__(self, frame, doc: dict, where: dict, out: Path) -> None:
        indices = doc.get("page_indices")
        if not isinstance(indices, (list, tuple)) or len(indices) != 2:
            raise InputError("page_indices must be [start, end]", **where, field="page_indices")
        start, end = (number(v, where, "page_indices", integer=True) for v in indices)
        if end < start:
            raise InputError(f"page_indices {indices} end before they start", **where, field="page_indices")
        name = str(doc["doc_name"])
        rows = frame.iloc[start : end + 1] if start >= 0 and end < len(frame) else None
        if rows is None or not (rows["doc_name"] == name).all():
            # Not the full parquet (or rows moved): take the document's rows by name, in stored order.
            rows = frame[frame["doc_name"] == name]
            if len(rows) != end - start + 1:
                raise InputError(
                    f"the pages parquet holds {len(rows)} page(s) of {name}, page_indices {indices} say "
                    f"{end - start + 1}",
                    **where,
                    field="page_indices",
                )
        self.rows, self.start, self.where = rows, start, where
        self.folder = inside(out, out / "pages" / safe_name(name))
        self.paths: dict[int, tuple[str, tuple[int, int]]] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def page(self, k: int) -> tuple[str, tuple[int, int]]:
        """Return the image path and (width, height) of 0-based page `k`."""
        if k not in self.paths:
            raw = self.rows.iloc[k]["image_binary"]
            data = raw.get("bytes") if isinstance(raw, dict) else raw
            if not isinstance(data, (bytes, bytearray)):
                raise InputError(
                    f"page row {self.start + k} has no image_binary", **self.where, field="image_binary"
                )
            try:
                with Image.open(io.BytesIO(data)) as image:
                    size, kind = image.size, (image.format or "png").lower()
            except Exception as exc:  # PIL raises many types for bytes that are not an image
                raise InputError(
                    f"page row {self.start + k} is not an image: {exc}", **self.where, field="image_binary"
                ) from None
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / f"{k + 1:04d}.{'jpg' if kind == 'jpeg' else kind}"
            if not path.is_file():
                path.write_bytes(bytes(data))
            self.paths[k] = (str(path), size)
        return self.paths[k]


def _pages_of(item: dict, n: int, where: dict) -> tuple[list[int], list[dict]]:
    """Check a question's evidence pages and layout items against the document's `n` pages."""
    pages = item.get("page_id") or []
    layouts = item.get("layout_mapping") or []
    if not isinstance(pages, list) or not isinstance(layouts, list):
        raise InputError("page_id and layout_mapping must be lists", **where, field="page_id")
    for page in pages:
        if isinstance(page, bool) or not isinstance(page, int) or not 0 <= page < n:
            raise InputError(f"evidence page {page!r} is not a page of the {n}", **where, field="page_id")
    for m in layouts:
        ok = isinstance(m, dict) and type(m.get("page")) is int and 0 <= m["page"] < n
        if not ok or not isinstance(m.get("bbox"), list) or len(m["bbox"]) != 4:
            raise InputError(f"bad layout item {m!r}", **where, field="layout_mapping")
    return sorted(set(pages)), layouts


def _layout_targets(
    layouts: list[dict], shown: list[int], document: _Document, where: dict
) -> tuple[list[dict], list[dict], list[dict]]:
    """Layout boxes as targets on the shown pages: (targets, clips made, boxes dropped with the reason)."""
    targets, clipped, dropped = [], [], []
    for m in layouts:
        k = shown.index(m["page"])
        _, (width, height) = document.page(m["page"])
        size = m.get("page_size") or [width, height]
        if not isinstance(size, list) or len(size) != 2:
            raise InputError(f"bad page_size {size!r}", **where, field="layout_mapping")
        pw, ph = (number(v, where, "layout_mapping.page_size") for v in size)
        if min(pw, ph) <= 0:
            raise InputError(f"bad page_size {size!r}", **where, field="layout_mapping")
        raw = [number(v, where, "layout_mapping.bbox") for v in m["bbox"]]
        box, changed = clip_box(raw, pw, ph)
        if box is None:
            dropped.append({"page": m["page"] + 1, "bbox": raw, "reason": "empty once clipped to the page"})
            continue
        sx, sy = width / pw, height / ph
        # Clip again in pixels: the float scaling may overshoot the image edge by a rounding error.
        box, _ = clip_box([box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy], width, height)
        if box is None:
            dropped.append({"page": m["page"] + 1, "bbox": raw, "reason": "empty once scaled to the image"})
            continue
        if changed:
            clipped.append({"page": m["page"] + 1, "bbox": raw, "page_size": [pw, ph], "clipped": box})
        targets.append({"image": k, "box": box})
    return targets, clipped, dropped


def _convert(
    source: Path, out: Path, records: Records, level: str, max_pages: int | None, pages_mode: str
) -> None:
    import pandas as pd

    annotations = find_one(source, ["MMDocIR_annotations.jsonl"], "MMDocIR_annotations.jsonl")
    pages_path = find_one(source, ["MMDocIR_pages.parquet"], "MMDocIR_pages.parquet")
    import pyarrow.parquet as pq

    try:
        names = pq.ParquetFile(pages_path).schema_arrow.names
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... for a file that is not parquet
        raise InputError(f"not a parquet file: {exc}", file=str(pages_path)) from None
    for column in ("doc_name", "image_binary"):
        if column not in names:
            raise InputError(f"missing column {column!r}", file=str(pages_path), field=column)
    # Only the columns used: the published file also holds every page's OCR and VLM text.
    frame = pd.read_parquet(pages_path, columns=["doc_name", "image_binary"])
    for line, text in read_lines(annotations):
        if not text.strip():
            continue
        where = {"file": str(annotations), "line": line}
        document = None
        with records.guard(where):
            doc = parse_json(text, **where)
            if (
                not isinstance(doc, dict)
                or "doc_name" not in doc
                or not isinstance(doc.get("questions"), list)
            ):
                raise InputError("a document needs doc_name and questions", **where, field="questions")
            document = _Document(frame, doc, where, out)
        if document is None:
            continue
        for q, item in enumerate(doc["questions"]):
            qwhere = {**where, "sample": f"mmdocir-{line}-{q}"}
            with records.guard(qwhere):
                if not isinstance(item, dict) or not item.get("Q"):
                    raise InputError("a question needs Q", **qwhere, field="Q")
                pages, layouts = _pages_of(item, len(document), qwhere)
                evidence = sorted(set(pages) | {m["page"] for m in layouts})
                shown = shown_pages(records, qwhere, len(document), evidence, max_pages, pages_mode)
                if shown is None:  # skipped, with its reason
                    continue
                boxes, clipped, dropped = (
                    _layout_targets(layouts, shown, document, qwhere) if level != "page" else ([], [], [])
                )
                page_targets = [{"image": shown.index(p)} for p in pages]
                if level == "layout" and layouts and not boxes:
                    records.skip(qwhere, "every layout box is empty once clipped to its page")
                    continue
                if level == "auto":
                    omega = "layout" if boxes else "page"
                    targets = boxes or page_targets
                else:
                    omega = level
                    targets = {"page": page_targets, "layout": boxes, "both": page_targets + boxes}[level]
                records.add(
                    {
                        "id": qwhere["sample"],
                        "task": "document",
                        "images": [document.page(p)[0] for p in shown],
                        "question": str(item["Q"]),
                        "answer": None if item.get("A") is None else str(item["A"]),
                        "targets": targets or None,
                        "dataset": "mmdocir",
                        "doc_name": doc["doc_name"],
                        "domain": doc.get("domain"),
                        "type": item.get("type"),
                        "pages": [p + 1 for p in shown],
                        "page_id": pages,
                        "omega": omega if targets else None,
                        "clipped": clipped or None,
                        "dropped_boxes": dropped or None,
                    }
                )


@reader
def convert(
    source: Path,
    out: Path,
    *,
    skip_bad: bool = False,
    level: str = "auto",
    max_pages: int | None = 64,
    pages: str = "window",
    limit: int | None = None,
):
    """Convert MMDocIR at `source` into `out/mmdocir.jsonl` plus the page images."""
    if level not in LEVELS:
        raise InputError(f"level must be one of {LEVELS}, got {level!r}", field="level")
    if pages not in PAGE_MODES:
        raise InputError(f"pages must be one of {PAGE_MODES}, got {pages!r}", field="pages")
    records = Records(skip_bad, limit)
    run_until_limit(_convert, source, out, records, level, max_pages, pages)
    return records.write(out / "mmdocir.jsonl")
