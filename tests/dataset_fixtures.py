"""Fixtures of the four native dataset formats: genuine published records (tests/data/<dataset>/, each
with a SOURCES note) with stand-in media of the recorded sizes, and small files written to the published
schemas for the malformed cases.

Stand-in media encode their index in the pixels (`index_colour` / `read_index`), so that a test can check
which page or frame reached the prompt.

Where each schema comes from:
- RefCOCOg: the `refer` toolkit release (`refs(umd).p`: a pickled list of refs with `ref_id`, `ann_id`,
  `image_id`, `split`, `sentences` [{`sent`, `raw`, `sent_id`}]; `instances.json`: COCO `images` and
  `annotations` with `bbox` = [x, y, w, h]) and the hub parquet layout (lmms-lab/RefCOCOg: `question_id`,
  `image` {bytes}, `question`, `answer` = the expressions, `bbox`, `file_name`).
- VidSTG: the sentence annotations of the VidSTG-Dataset repository (`{split}_annotations.json`) and the
  VidOR trajectory files (`trajectories`: per frame, `{tid, bbox: {xmin, ymin, xmax, ymax}}`).
- MMLongBench-Doc: `samples.json` of the benchmark (`doc_id`, `question`, `answer`, `evidence_pages` as
  a string, `answer_format`) and PDFs under `documents/`.
- MMDocIR: the evaluation set's dataset card (`MMDocIR_annotations.jsonl` with `page_indices` and
  questions `Q`, `A`, `type`, `page_id`, `layout_mapping`; `MMDocIR_pages.parquet` with `doc_name`,
  `passage_id`, `image_binary`).
"""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
from helpers import noise_image
from PIL import Image


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def refcocog_release(root: Path, *, bad: bool = False) -> Path:
    """Write refs(umd).p + instances.json + two COCO images; `bad` adds a ref whose annotation is missing."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "images").mkdir(exist_ok=True)
    images = [{"id": 1, "file_name": "COCO_train2014_000000000001.jpg", "width": 200, "height": 150},
              {"id": 2, "file_name": "COCO_train2014_000000000002.jpg", "width": 120, "height": 160}]  # fmt: skip
    for i, im in enumerate(images):
        noise_image(im["width"], im["height"], seed=i).save(root / "images" / im["file_name"])
    annotations = [
        {"id": 11, "image_id": 1, "bbox": [20.0, 30.0, 50.0, 40.0], "category_id": 47},
        {"id": 12, "image_id": 2, "bbox": [10.5, 20.0, 30.0, 60.0], "category_id": 1},
    ]
    (root / "instances.json").write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": []})
    )
    refs = [
        {"ref_id": 100, "ann_id": 11, "image_id": 1, "split": "val", "category_id": 47, "file_name": "x.jpg",
         "sentences": [{"sent": "the cup on the left", "raw": "The cup on the left.", "sent_id": 1},
                       {"sent": "a white cup", "raw": "A white cup", "sent_id": 2}]},
        {"ref_id": 101, "ann_id": 12, "image_id": 2, "split": "train", "category_id": 1, "file_name": "y.jpg",
         "sentences": [{"sent": "man in red", "raw": "man in red", "sent_id": 3}]},
    ]  # fmt: skip
    if bad:
        refs.append(
            {"ref_id": 102, "ann_id": 99, "image_id": 1, "split": "val", "sentences": [{"sent": "ghost"}]}
        )
    (root / "refs(umd).p").write_bytes(pickle.dumps(refs))
    return root


def refcocog_parquet(root: Path) -> Path:
    """Write one parquet file in the hub layout (two rows)."""
    root.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(
        {
            "question_id": ["q0", "q1"],
            "image": [{"bytes": _png(noise_image(100, 80, seed=5)), "path": None},
                      {"bytes": _png(noise_image(90, 90, seed=6)), "path": None}],
            "question": ["Please carefully observe the area", "Please carefully observe the area"],
            "answer": [["the dog", "a brown dog"], ["the chair"]],
            "bbox": [[5.0, 6.0, 20.0, 30.0], [0.0, 0.0, 45.0, 45.0]],
            "file_name": ["a.jpg", "b.jpg"],
        }
    )  # fmt: skip
    path = root / "val-00000.parquet"
    frame.to_parquet(path)
    return path


def vidstg(root: Path, *, as_video: bool = True) -> Path:
    """Write test_annotations.json, a VidOR trajectory file and the video (mp4 or a frame folder)."""
    import av

    vid, frames, width, height = "5159741010", 20, 64, 48
    root.mkdir(parents=True, exist_ok=True)
    pictures = [np.full((height, width, 3), 10 * f, dtype=np.uint8) for f in range(frames)]
    if as_video:
        (root / "video" / "0000").mkdir(parents=True, exist_ok=True)
        with av.open(str(root / "video" / "0000" / f"{vid}.mp4"), "w") as container:
            stream = container.add_stream("mpeg4", rate=10)
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            for picture in pictures:
                container.mux(stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")))
            container.mux(stream.encode())
    else:
        (root / "frames" / vid).mkdir(parents=True, exist_ok=True)
        for f, picture in enumerate(pictures):
            Image.fromarray(picture).save(root / "frames" / vid / f"{f + 1:05d}.jpg")
    trajectories = [
        [{"tid": 0, "bbox": {"xmin": 2 * f, "ymin": 5, "xmax": 2 * f + 10, "ymax": 20}, "generated": 0},
         {"tid": 1, "bbox": {"xmin": 40, "ymin": 20, "xmax": 60, "ymax": 40}, "generated": 0}]
        for f in range(frames)
    ]  # fmt: skip
    (root / "annotation" / "validation" / "0000").mkdir(parents=True, exist_ok=True)
    vidor = {"video_id": vid, "frame_count": frames, "fps": 10, "width": width, "height": height,
             "subject/objects": [{"tid": 0, "category": "dog"}, {"tid": 1, "category": "ball"}],
             "trajectories": trajectories}  # fmt: skip
    (root / "annotation" / "validation" / "0000" / f"{vid}.json").write_text(json.dumps(vidor))
    entry = {
        "vid": vid, "frame_count": frames, "fps": 10.0, "width": width, "height": height,
        "subject/objects": vidor["subject/objects"],
        "used_segment": {"begin_fid": 0, "end_fid": 19}, "temporal_gt": {"begin_fid": 5, "end_fid": 14},
        "captions": [{"target_id": 0, "description": "a dog runs to the right.", "type": "declar"}],
        "questions": [{"target_id": 1, "description": "what lies still on the ground?", "type": "inter"}],
    }  # fmt: skip
    (root / "sent_annos").mkdir(exist_ok=True)
    (root / "sent_annos" / "test_annotations.json").write_text(json.dumps([entry]))
    return root


def mmlongbench(root: Path, *, bad: bool = False) -> Path:
    """Write a 5-page PDF and samples.json (two answerable questions, one not answerable)."""
    (root / "documents").mkdir(parents=True, exist_ok=True)
    pages = [noise_image(300, 400, seed=20 + p) for p in range(5)]
    pages[0].save(root / "documents" / "report.pdf", save_all=True, append_images=pages[1:], resolution=72)
    samples = [
        {"doc_id": "report.pdf", "doc_type": "Research report", "question": "What is the total?", "answer": "42",
         "evidence_pages": "[2, 4]", "evidence_sources": "['Table']", "answer_format": "Int"},
        {"doc_id": "report.pdf", "doc_type": "Research report", "question": "Who wrote it?", "answer": "Ann",
         "evidence_pages": "[1]", "evidence_sources": "['Pure-text (Plain-text)']", "answer_format": "Str"},
        {"doc_id": "report.pdf", "doc_type": "Research report", "question": "What is the GDP of Mars?",
         "answer": "Not answerable", "evidence_pages": "[]", "evidence_sources": "[]", "answer_format": "None"},
    ]  # fmt: skip
    if bad:
        samples.append({"doc_id": "missing.pdf", "question": "Where?", "evidence_pages": "[1]"})
    (root / "samples.json").write_text(json.dumps(samples))
    return root


def mmdocir(root: Path) -> Path:
    """Write MMDocIR_pages.parquet (two documents) and MMDocIR_annotations.jsonl."""
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for doc, n in (("alpha", 3), ("beta", 2)):
        for p in range(n):
            rows.append({"doc_name": doc, "domain": "news", "passage_id": p, "image_path": f"{doc}_{p}.png",
                         "image_binary": _png(noise_image(160, 200, seed=40 + len(rows))), "ocr_text": "", "vlm_text": ""})  # fmt: skip
    pd.DataFrame(rows).to_parquet(root / "MMDocIR_pages.parquet")
    docs = [
        {"doc_name": "alpha", "domain": "news", "page_indices": [0, 2], "layout_indinces": [0, 0],
         "questions": [{"Q": "What does the chart show?", "A": "sales", "type": "Image", "page_id": [1],
                        "layout_mapping": [{"page": 1, "page_size": [800, 1000], "bbox": [100, 200, 400, 500]}]}]},
        {"doc_name": "beta", "domain": "news", "page_indices": [3, 4], "layout_indinces": [1, 1],
         "questions": [{"Q": "Which year?", "A": "2020", "type": "Text", "page_id": [0], "layout_mapping": []}]},
    ]  # fmt: skip
    (root / "MMDocIR_annotations.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    return root


DATA = Path(__file__).parent / "data"


def index_colour(index: int) -> tuple[int, int, int]:
    """A flat colour that encodes `index` (0-4095) robustly enough to survive JPEG and PDF rendering."""
    return ((index % 16) * 16 + 8, (index // 16) % 16 * 16 + 8, (index // 256) * 16 + 8)


def read_index(image: Image.Image) -> int:
    """Decode the index painted by `index_colour` from the centre of an image."""
    width, height = image.size
    patch = np.asarray(image.convert("RGB").crop((width // 4, height // 4, 3 * width // 4, 3 * height // 4)))
    r, g, b = (int(round((float(patch[..., c].mean()) - 8) / 16)) for c in range(3))
    return r + 16 * g + 256 * b


def vidstg_standin_box(tid: int, fid: int, width: int, height: int) -> list[float] | None:
    """The stand-in VidOR box of object `tid` on frame `fid`: no box on frames 5 mod 11, past the right
    edge on frames 8 mod 11, entirely right of the frame on frames 6 mod 11, inside it otherwise (11 is
    prime to the sampling step of 15 frames, so every case reaches the sampled frames; frame 90, where a
    published temporal_gt ends, has a box)."""
    if fid % 11 == 5:
        return None
    x0, y0 = 10.0 + 4 * tid + fid % 13, 12.0 + 3 * tid
    if fid % 11 == 8:
        return [width - 30.0, y0, width + 25.0, y0 + 40.0]
    if fid % 11 == 6:
        return [width + 5.0, y0, width + 60.0, y0 + 40.0]
    return [x0, y0, x0 + width / 3, y0 + height / 4]


def genuine_vidstg(root: Path) -> Path:
    """The published VidSTG entries of tests/data/vidstg with stand-in frame folders and VidOR trajectories."""
    entries = json.loads((DATA / "vidstg" / "test_annotations.json").read_text())
    (root / "sent_annos").mkdir(parents=True, exist_ok=True)
    (root / "sent_annos" / "test_annotations.json").write_text(json.dumps(entries))
    videos = {e["vid"]: e for e in entries}
    for vid, e in videos.items():
        width, height, count = e["width"], e["height"], e["frame_count"]
        folder = root / "frames" / vid
        folder.mkdir(parents=True, exist_ok=True)
        for f in range(count):
            Image.new("RGB", (width, height), index_colour(f)).save(folder / f"{f + 1:05d}.jpg", quality=90)
        tids = [o["tid"] for o in e["subject/objects"]]
        trajectories = []
        for f in range(count):
            boxes = [(t, vidstg_standin_box(t, f, width, height)) for t in tids]
            trajectories.append(
                [{"tid": t, "bbox": dict(zip(("xmin", "ymin", "xmax", "ymax"), b)), "generated": 0}
                 for t, b in boxes if b is not None]
            )  # fmt: skip
        vidor = {"video_id": vid, "frame_count": count, "fps": e["fps"], "width": width, "height": height,
                 "subject/objects": e["subject/objects"], "trajectories": trajectories}  # fmt: skip
        (root / "annotation" / "validation").mkdir(parents=True, exist_ok=True)
        (root / "annotation" / "validation" / f"{vid}.json").write_text(json.dumps(vidor))
    return root


def mmdocir_page_size(doc: dict, page: int) -> tuple[float, float]:
    """The recorded size of a page: its layout items' page_size, else the document's most common one."""
    sizes = [tuple(m["page_size"]) for q in doc["questions"] for m in q.get("layout_mapping") or []]
    exact = [tuple(m["page_size"]) for q in doc["questions"] for m in q.get("layout_mapping") or []
             if m["page"] == page]  # fmt: skip
    if exact:
        return exact[0]
    return max(set(sizes), key=sizes.count) if sizes else (612.0, 792.0)


MMDOCIR_SCALE = 0.25  # stand-in page images: a quarter of the page size in points


def genuine_mmdocir(root: Path) -> Path:
    """The published MMDocIR lines of tests/data/mmdocir with a stand-in pages parquet of those documents."""
    text = (DATA / "mmdocir" / "MMDocIR_annotations.jsonl").read_text()
    root.mkdir(parents=True, exist_ok=True)
    (root / "MMDocIR_annotations.jsonl").write_text(text)
    rows = []
    for line in text.splitlines():
        doc = json.loads(line)
        start, end = doc["page_indices"]
        for k in range(end - start + 1):
            w, h = mmdocir_page_size(doc, k)
            size = (max(1, round(w * MMDOCIR_SCALE)), max(1, round(h * MMDOCIR_SCALE)))
            buffer = io.BytesIO()
            Image.new("RGB", size, index_colour(k)).save(buffer, format="JPEG", quality=90)
            rows.append({"doc_name": doc["doc_name"], "domain": doc["domain"], "passage_id": str(k),
                         "image_path": f"{doc['doc_name']}_{k}.jpg", "image_binary": buffer.getvalue(),
                         "ocr_text": "", "vlm_text": ""})  # fmt: skip
    pd.DataFrame(rows).to_parquet(root / "MMDocIR_pages.parquet")
    return root


def genuine_mmlongbench(root: Path) -> Path:
    """The published MMLongBench-Doc questions of tests/data/mmlongbench with stand-in PDFs of the
    recorded page counts and sizes (documents.json), each page painted with its 0-based page number."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "samples.json").write_text((DATA / "mmlongbench" / "samples.json").read_text())
    (root / "documents").mkdir(exist_ok=True)
    for name, sizes in json.loads((DATA / "mmlongbench" / "documents.json").read_text()).items():
        w0, h0 = sizes[0]
        # 8 pixels per first-page side; PIL writes one resolution for all pages, so other sizes scale.
        pages = [Image.new("RGB", (round(8 * w / w0), round(8 * h / h0)), index_colour(p))
                 for p, (w, h) in enumerate(sizes)]  # fmt: skip
        pages[0].save(root / "documents" / name, save_all=True, append_images=pages[1:],
                      dpi=(8 * 72 / w0, 8 * 72 / h0))  # fmt: skip
    return root


def genuine_refcocog(root: Path) -> tuple[Path, dict]:
    """refs(umd).p rebuilt from the published RefCOCOg UMD val rows + instances.json, with stand-ins.

    Returns the folder and the stand-ins used: per ref_id its (ann_id, COCO bbox) and per image its size.
    One stand-in box extends past its image and one lies entirely outside it (the clipping cases).
    """
    import csv

    root.mkdir(parents=True, exist_ok=True)
    refs: dict[int, dict] = {}
    with open(DATA / "refcocog" / "refcocog_umd_val.csv", newline="") as f:
        for row in csv.DictReader(f):
            ref = refs.setdefault(int(row["ref_id"]), {"ref_id": int(row["ref_id"]), "image_id": int(row["img_id"]),
                                                      "split": "val", "sentences": [], "sent_ids": []})  # fmt: skip
            ref["sentences"].append({"sent": row["sent"], "sent_id": int(row["sent_id"]),
                                     "tokens": row["sent"].split(), "raw": row["sent"]})  # fmt: skip
            ref["sent_ids"].append(int(row["sent_id"]))
    published = json.loads((DATA / "refcocog" / "published.json").read_text())
    images = [published["image"]]
    annotations = [published["annotation"]]
    standins = {"boxes": {}, "sizes": {}}
    for n, (ref_id, ref) in enumerate(sorted(refs.items())):
        size = (320 + 16 * n, 240 + 8 * n)
        if ref["image_id"] not in standins["sizes"]:
            standins["sizes"][ref["image_id"]] = size
            images.append({"id": ref["image_id"], "width": size[0], "height": size[1],
                           "file_name": f"COCO_train2014_{ref['image_id']:012d}.jpg"})  # fmt: skip
        width, height = standins["sizes"][ref["image_id"]]
        bbox = [12.5 + n, 20.25, 100.0 + 2 * n, 80.5]
        if n == 2:
            bbox = [width - 40.0, 30.0, 90.0, 50.0]  # extends 50 px past the right edge
        if n == 3:
            bbox = [width + 10.0, 30.0, 20.0, 20.0]  # entirely right of the image
        ann_id = 900000 + ref_id
        annotations.append({"id": ann_id, "image_id": ref["image_id"], "bbox": bbox, "category_id": 1})
        ref.update(
            ann_id=ann_id, category_id=1, file_name=f"COCO_train2014_{ref['image_id']:012d}_{ann_id}.jpg"
        )
        standins["boxes"][ref_id] = (ann_id, bbox)
    # A stand-in ref on the published annotation 3007 of image 98304 (both used as published).
    refs[-1] = {"ref_id": 999999, "ann_id": 3007, "image_id": 98304, "split": "val", "category_id": 18,
                "sentences": [{"sent": "stand-in expression", "sent_id": 999999}], "sent_ids": [999999]}  # fmt: skip
    with open(root / "refs(umd).p", "wb") as f:
        pickle.dump(list(refs.values()), f, protocol=2)
    (root / "instances.json").write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": []})
    )
    (root / "images").mkdir(exist_ok=True)
    for im in images:
        Image.new("RGB", (im["width"], im["height"]), index_colour(im["id"] % 4096)).save(
            root / "images" / im["file_name"], quality=90
        )
    return root, standins
