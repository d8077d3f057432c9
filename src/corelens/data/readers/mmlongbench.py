"""MMLongBench-Doc: `samples.json` (question, answer, `doc_id`, `evidence_pages` as a string like "[3, 5]",
1-based) and the PDFs under `documents/`.

Pages are rendered with pypdfium2 so that the longer side is at most `max_side` pixels (the scale is
recorded in `render.json`); a sample shows the document's first `max_pages` pages and targets its evidence
pages as whole images. Questions without evidence pages ("Not answerable") have no target and are left
out unless `keep_unanswerable`.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from corelens.data.readers.common import Records, find_one, run_until_limit
from corelens.errors import InputError


def render_pdf(pdf: Path, folder: Path, max_side: int, max_pages: int | None) -> list[tuple[Path, float]]:
    """Render the pages of `pdf` into `folder` (PNG, longer side <= max_side); return (path, scale) per page."""
    import pypdfium2

    folder.mkdir(parents=True, exist_ok=True)
    try:
        document = pypdfium2.PdfDocument(str(pdf))
    except Exception as exc:  # pdfium raises its own error types
        raise InputError(f"cannot open the PDF: {exc}", file=str(pdf)) from None
    pages = []
    try:
        for p in range(len(document) if max_pages is None else min(len(document), max_pages)):
            page = document[p]
            width, height = page.get_size()  # PDF points
            scale = max_side / max(width, height)
            path = folder / f"{p + 1:04d}.png"
            if not path.is_file():
                page.render(scale=scale).to_pil().convert("RGB").save(path)
            pages.append((path, scale))
    finally:
        document.close()
    return pages


def _evidence(raw, where: dict) -> list[int]:
    value = raw
    if isinstance(raw, str):
        try:
            value = ast.literal_eval(raw) if raw.strip() else []
        except (ValueError, SyntaxError):
            raise InputError(
                f"evidence_pages is not a list: {raw!r}", **where, field="evidence_pages"
            ) from None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and v >= 1 for v in value):
        raise InputError(
            f"evidence_pages must list 1-based page numbers, got {raw!r}", **where, field="evidence_pages"
        )
    return sorted(set(value))


def _convert(
    source: Path, out: Path, records: Records, max_side: int, max_pages: int, keep_unanswerable: bool
) -> None:
    samples_path = find_one(source, ["samples.json"], "MMLongBench-Doc samples.json")
    documents = source / "documents" if (source / "documents").is_dir() else samples_path.parent / "documents"
    try:
        items = json.loads(samples_path.read_text())
    except ValueError as exc:
        raise InputError(f"invalid JSON: {exc}", file=str(samples_path)) from None
    rendered: dict[str, list[tuple[Path, float]]] = {}
    for i, item in enumerate(items):
        where = {"file": str(samples_path), "line": i + 1, "sample": f"mmlongbench-{i:05d}"}
        with records.guard(where):
            for key in ("doc_id", "question", "evidence_pages"):
                if not isinstance(item, dict) or key not in item:
                    raise InputError(f"missing {key!r}", **where, field=key)
            pages = _evidence(item["evidence_pages"], where)
            if not pages and not keep_unanswerable:
                continue
            doc = str(item["doc_id"])
            if doc not in rendered:
                pdf = documents / doc
                if not pdf.is_file():
                    raise InputError(f"document {doc} not found in {documents}", **where, field="doc_id")
                rendered[doc] = render_pdf(pdf, out / "pages" / Path(doc).stem, max_side, max_pages)
            shown = rendered[doc]
            if any(p > len(shown) for p in pages):
                raise InputError(
                    f"evidence page {max(pages)} is beyond the {len(shown)} pages shown (max_pages {max_pages})",
                    **where,
                    field="evidence_pages",
                )
            record = {
                "id": where["sample"],
                "task": "document",
                "images": [str(path) for path, _ in shown],
                "question": str(item["question"]),
                "targets": [{"image": p - 1} for p in pages],
                "doc_id": doc,
                "answer_format": item.get("answer_format"),
            }
            if item.get("answer") is not None:
                record["answer"] = str(item["answer"])
            records.add(record)
    (out / "render.json").write_text(
        json.dumps(
            {
                "renderer": "pypdfium2",
                "max_side": max_side,
                "max_pages": max_pages,
                "documents": len(rendered),
            }
        )
    )


def convert(
    source: Path,
    out: Path,
    *,
    skip_bad: bool = False,
    max_side: int = 1024,
    max_pages: int = 64,
    keep_unanswerable: bool = False,
    limit: int | None = None,
):
    """Convert MMLongBench-Doc at `source` into `out/mmlongbench.jsonl` plus rendered pages."""
    records = Records(skip_bad, limit)
    run_until_limit(_convert, source, out, records, max_side, max_pages, keep_unanswerable)
    return records.write(out / "mmlongbench.jsonl")
