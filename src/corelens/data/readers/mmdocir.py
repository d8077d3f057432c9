"""MMDocIR (evaluation set): `MMDocIR_annotations.jsonl` (one document per line: `doc_name`, `domain`,
`page_indices` = [start, end] rows of the pages parquet, `questions` with `Q`, `A`, `type`, `page_id`
and `layout_mapping` items `{page, page_size: [w, h], bbox: [x1, y1, x2, y2]}`) and
`MMDocIR_pages.parquet` (`doc_name`, `passage_id`, `image_binary`, ...), as the dataset card describes.

One sample per question: the document's pages (the first `max_pages`), targets = the evidence pages
(page level) and, with `level="layout"` (default "both"), the evidence layouts as boxes scaled from
`page_size` to the stored page image.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from PIL import Image

from corelens.data.readers.common import Records, find_one, run_until_limit
from corelens.errors import InputError

LEVELS = ("page", "layout", "both")


def _pages(
    frame, doc: dict, where: dict, out: Path, max_pages: int
) -> tuple[dict[int, int], list[str], list[tuple[int, int]]]:
    """Write one document's page images; return passage_id -> image index, image paths and sizes."""
    indices = doc.get("page_indices")
    if not isinstance(indices, (list, tuple)) or len(indices) != 2:
        raise InputError("page_indices must be [start, end]", **where, field="page_indices")
    start, end = int(indices[0]), int(indices[1])
    if not 0 <= start <= end < len(frame):
        raise InputError(
            f"page_indices {indices} outside the {len(frame)} rows of the pages parquet",
            **where,
            field="page_indices",
        )
    rows = frame.iloc[start : end + 1]
    folder = out / "pages" / "".join(c if c.isalnum() or c in "-_." else "_" for c in str(doc["doc_name"]))
    folder.mkdir(parents=True, exist_ok=True)
    index, paths, sizes = {}, [], []
    for k, row in enumerate(rows.head(max_pages).itertuples(index=False)):
        data = row.image_binary.get("bytes") if isinstance(row.image_binary, dict) else row.image_binary
        if not isinstance(data, (bytes, bytearray)):
            raise InputError(f"page row {start + k} has no image_binary", **where, field="image_binary")
        image = Image.open(io.BytesIO(data)).convert("RGB")
        path = folder / f"{k + 1:04d}.png"
        if not path.is_file():
            image.save(path)
        index[int(row.passage_id)] = k
        paths.append(str(path))
        sizes.append(image.size)
    return index, paths, sizes


def _convert(source: Path, out: Path, records: Records, level: str, max_pages: int) -> None:
    import pandas as pd

    annotations = find_one(source, ["MMDocIR_annotations.jsonl"], "MMDocIR_annotations.jsonl")
    pages_path = find_one(source, ["MMDocIR_pages.parquet"], "MMDocIR_pages.parquet")
    frame = pd.read_parquet(pages_path)
    for column in ("doc_name", "passage_id", "image_binary"):
        if column not in frame.columns:
            raise InputError(f"missing column {column!r}", file=str(pages_path), field=column)
    for line, text in enumerate(annotations.read_text().splitlines(), start=1):
        if not text.strip():
            continue
        where = {"file": str(annotations), "line": line}
        with records.guard(where):
            try:
                doc = json.loads(text)
            except ValueError as exc:
                raise InputError(f"invalid JSON: {exc}", **where) from None
            if "doc_name" not in doc or not isinstance(doc.get("questions"), list):
                raise InputError("a document needs doc_name and questions", **where, field="questions")
            index, paths, sizes = _pages(frame, doc, where, out, max_pages)
        if not index:
            continue
        for q, item in enumerate(doc["questions"]):
            qwhere = {**where, "sample": f"mmdocir-{line}-{q}"}
            with records.guard(qwhere):
                if not isinstance(item, dict) or not item.get("Q"):
                    raise InputError("a question needs Q", **qwhere, field="Q")
                targets = []
                if level in ("page", "both"):
                    for page in item.get("page_id") or []:
                        if int(page) not in index:
                            raise InputError(
                                f"evidence page {page} is not among the pages shown",
                                **qwhere,
                                field="page_id",
                            )
                        targets.append({"image": index[int(page)]})
                if level in ("layout", "both"):
                    for m in item.get("layout_mapping") or []:
                        if int(m.get("page", -1)) not in index:
                            raise InputError(
                                f"layout page {m.get('page')} is not among the pages shown",
                                **qwhere,
                                field="layout_mapping",
                            )
                        k = index[int(m["page"])]
                        pw, ph = m.get("page_size") or sizes[k]
                        sx, sy = sizes[k][0] / float(pw), sizes[k][1] / float(ph)
                        x0, y0, x1, y1 = (float(v) for v in m["bbox"])
                        targets.append({"image": k, "box": [x0 * sx, y0 * sy, x1 * sx, y1 * sy]})
                if not targets:
                    raise InputError("no evidence page or layout", **qwhere, field="page_id")
                records.add(
                    {
                        "id": qwhere["sample"],
                        "task": "document",
                        "images": paths,
                        "question": str(item["Q"]),
                        "answer": None if item.get("A") is None else str(item["A"]),
                        "targets": targets,
                        "doc_name": doc["doc_name"],
                        "type": item.get("type"),
                    }
                )


def convert(
    source: Path,
    out: Path,
    *,
    skip_bad: bool = False,
    level: str = "both",
    max_pages: int = 64,
    limit: int | None = None,
):
    """Convert MMDocIR at `source` into `out/mmdocir.jsonl` plus the page images."""
    if level not in LEVELS:
        raise InputError(f"level must be one of {LEVELS}, got {level!r}")
    records = Records(skip_bad, limit)
    run_until_limit(_convert, source, out, records, level, max_pages)
    return records.write(out / "mmdocir.jsonl")
