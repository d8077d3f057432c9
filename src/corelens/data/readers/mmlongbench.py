"""MMLongBench-Doc: `samples.json` (question, answer, `doc_id`, `evidence_pages` as a string like "[3, 5]",
1-based) and the PDFs under `documents/`.

Pages are rendered with pypdfium2 so that the longer side is at most `max_side` pixels (recorded in
`render.json`). A sample shows at most `max_pages` pages of its document, chosen by `pages`: "window"
(default) `max_pages` consecutive pages around the evidence, so that every evidence page is shown however
long the document; "first" the first `max_pages` pages (a question whose evidence lies beyond them is
skipped with its reason); "all" every page. The 1-based page numbers of the pages shown are recorded in
`pages`, and targets are the evidence pages as whole images.

A question with no evidence page is kept without a target when it has an answer (the scoring commands use
it; `rank` skips it with its reason); a "Not answerable" question is skipped with its reason unless
`keep_unanswerable`.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from corelens.data.paths import inside, safe_name
from corelens.data.readers.common import (
    PAGE_MODES,
    Records,
    find_one,
    read_json_list,
    reader,
    run_until_limit,
    shown_pages,
)
from corelens.errors import InputError

UNANSWERABLE = "Not answerable"


class Pdf:
    """One PDF, opened once; pages are rendered on demand into `folder` (PNG, longer side <= max_side)."""

    def __init__(self, pdf: Path, folder: Path, max_side: int) -> None:
        import pypdfium2

        try:
            self.document = pypdfium2.PdfDocument(str(pdf))
        except Exception as exc:  # pdfium raises its own error types
            raise InputError(f"cannot open the PDF: {exc}", file=str(pdf)) from None
        self.folder, self.max_side = folder, max_side
        self.pages = len(self.document)
        folder.mkdir(parents=True, exist_ok=True)

    def render(self, p: int) -> Path:
        """Return the image of 0-based page `p`, rendering it the first time."""
        path = self.folder / f"{p + 1:04d}.png"
        if not path.is_file():
            page = self.document[p]
            width, height = page.get_size()  # PDF points
            page.render(scale=self.max_side / max(width, height)).to_pil().convert("RGB").save(path)
        return path

    def close(self) -> None:
        """Release the document."""
        self.document.close()


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
    source: Path,
    out: Path,
    records: Records,
    max_side: int,
    max_pages: int | None,
    pages_mode: str,
    keep_unanswerable: bool,
) -> None:
    samples_path = find_one(source, ["samples.json"], "MMLongBench-Doc samples.json")
    documents = source / "documents" if (source / "documents").is_dir() else samples_path.parent / "documents"
    items = read_json_list(samples_path, "samples.json must hold a list of questions")
    opened: dict[str, Pdf] = {}
    try:
        for i, item in enumerate(items):
            where = {"file": str(samples_path), "line": i + 1, "sample": f"mmlongbench-{i:05d}"}
            with records.guard(where):
                for key in ("doc_id", "question", "evidence_pages"):
                    if not isinstance(item, dict) or key not in item:
                        raise InputError(f"missing {key!r}", **where, field=key)
                evidence = _evidence(item["evidence_pages"], where)
                answer = None if item.get("answer") is None else str(item["answer"])
                if not evidence and answer == UNANSWERABLE and not keep_unanswerable:
                    records.skip(where, "not answerable: no evidence page and no answer")
                    continue
                doc = str(item["doc_id"])
                if doc not in opened:
                    pdf = documents / doc
                    if Path(doc).is_absolute() or ".." in Path(doc).parts:
                        # doc_id names a file under documents/; it may not point elsewhere.
                        raise InputError(
                            f"doc_id {doc!r} is not a path inside {documents}", **where, field="doc_id"
                        )
                    if not pdf.is_file():
                        raise InputError(f"document {doc} not found in {documents}", **where, field="doc_id")
                    opened[doc] = Pdf(pdf, inside(out, out / "pages" / safe_name(doc)), max_side)
                document = opened[doc]
                if evidence and evidence[-1] > document.pages:
                    raise InputError(
                        f"evidence page {evidence[-1]} is beyond the {document.pages} pages of {doc}",
                        **where,
                        field="evidence_pages",
                    )
                zero = [p - 1 for p in evidence]
                shown = shown_pages(records, where, document.pages, zero, max_pages, pages_mode)
                if shown is None:  # skipped, with its reason
                    continue
                record = {
                    "id": where["sample"],
                    "task": "document",
                    "images": [str(document.render(p)) for p in shown],
                    "question": str(item["question"]),
                    "answer": answer,
                    "targets": [{"image": shown.index(p)} for p in zero] or None,
                    "dataset": "mmlongbench",
                    "doc_id": doc,
                    "pages": [p + 1 for p in shown],
                    "evidence_pages": evidence,
                    "evidence_sources": item.get("evidence_sources"),
                    "answer_format": item.get("answer_format"),
                }
                records.add(record)
    finally:
        for document in opened.values():
            document.close()
        inside(out, out / "render.json").write_text(
            json.dumps(
                {
                    "renderer": "pypdfium2",
                    "max_side": max_side,
                    "max_pages": max_pages,
                    "pages": pages_mode,
                    "documents": {doc: d.pages for doc, d in opened.items()},
                }
            )
        )


@reader
def convert(
    source: Path,
    out: Path,
    *,
    skip_bad: bool = False,
    max_side: int = 1024,
    max_pages: int | None = 64,
    pages: str = "window",
    keep_unanswerable: bool = False,
    limit: int | None = None,
):
    """Convert MMLongBench-Doc at `source` into `out/mmlongbench.jsonl` plus rendered pages."""
    if pages not in PAGE_MODES:
        raise InputError(f"pages must be one of {PAGE_MODES}, got {pages!r}", field="pages")
    records = Records(skip_bad, limit)
    run_until_limit(_convert, source, out, records, max_side, max_pages, pages, keep_unanswerable)
    return records.write(out / "mmlongbench.jsonl")
