"""Small fixture copies of the four native dataset formats, written to their published schemas.

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
