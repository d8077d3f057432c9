"""Hostile or damaged inputs (issue 32, points 3, 6 and 8): file names from data, hub ids and revisions, head-set
files, reader field types, --options keys, checkpoints asking for their own code, ram.parquet of another schema.

Every payload is generated here; nothing needs the network. A refusal is a CorelensError (one line through the
CLI, exit 2); memory is measured with tracemalloc where a file claims a huge shape.
"""

from __future__ import annotations

import io
import json
import shutil
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from dataset_fixtures import mmdocir, vidstg
from helpers import noise_image

import corelens
from corelens.cli import main
from corelens.data.paths import inside, safe_name
from corelens.data.readers import convert
from corelens.errors import CorelensError, InputError
from corelens.heads import HeadSet
from corelens.heads.formats import DUO_CONFIG, DUO_TSV, read_duo, read_sparsemm
from corelens.models.hub import check_revision, resolve

HOSTILE_IDS = ["../../../x", "..", ".", "a b", "a_b", "a?b", "a*b", "A_B", "ok-1.2", "a_b--0123456789abcdef"]


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("corelens"), err
    return lines[0]


def _png(width: int, height: int, seed: int) -> bytes:
    buffer = io.BytesIO()
    noise_image(width, height, seed=seed).save(buffer, format="PNG")
    return buffer.getvalue()


# --- A. file names derived from data -----------------------------------------------------------------------


def test_safe_name_keeps_safe_names_and_never_maps_two_values_to_one():
    values = [*HOSTILE_IDS, "/etc/passwd", "a\\b", "é", "x" * 300, "CON", ""]
    values += [safe_name(v) for v in values]  # a hashed name given back as a value must not collide with it
    names = {v: safe_name(v) for v in values}
    assert len(set(names.values())) == len(names)
    assert names["ok-1.2"] == "ok-1.2" and names["a_b"] == "a_b"
    for name in names.values():
        assert name not in (".", "..") and "/" not in name and "\\" not in name and len(name) <= 100
        assert name == name.lower()  # distinct on a case-insensitive file system too


def test_refcocog_question_ids_write_under_out_with_distinct_names(tmp_path):
    outside = tmp_path / "victim"
    ids = [*HOSTILE_IDS, str(outside / "abs")]
    frame = pd.DataFrame(
        {
            "question_id": ids,
            "image": [{"bytes": _png(40, 30, i), "path": None} for i in range(len(ids))],
            "answer": [["thing"]] * len(ids),
            "bbox": [[1.0, 1.0, 10.0, 10.0]] * len(ids),
        }
    )
    (tmp_path / "src").mkdir()
    frame.to_parquet(tmp_path / "src" / "val.parquet")
    work = tmp_path / "deep" / "er" / "still"
    work.mkdir(parents=True)
    out = work / "out"
    result = convert(f"refcocog:{tmp_path / 'src' / 'val.parquet'}", out)
    records = [json.loads(line) for line in result.path.read_text().splitlines()]
    images = {r["images"][0] for r in records}
    assert len(records) == len(ids) and len(images) == len(ids)  # one distinct PNG per question id
    for image in images:
        assert Path(image).resolve().parent == (out / "images").resolve()
    written = {p.name for p in (out / "images").iterdir()}
    assert written == {Path(i).name for i in images}
    assert not outside.exists() and not (work / "x.png").exists() and not (tmp_path / "x.png").exists()


def test_a_symlink_in_the_output_folder_is_not_followed_out(tmp_path):
    (tmp_path / "src").mkdir()
    frame = pd.DataFrame(
        {
            "question_id": ["q0"],
            "image": [{"bytes": _png(40, 30, 0)}],
            "answer": [["x"]],
            "bbox": [[1, 1, 5, 5]],
        }
    )
    frame.to_parquet(tmp_path / "src" / "val.parquet")
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "images").symlink_to(elsewhere)
    with pytest.raises(InputError, match="outside"):
        convert(f"refcocog:{tmp_path / 'src' / 'val.parquet'}", out)
    assert list(elsewhere.iterdir()) == []
    with pytest.raises(InputError, match="outside"):
        inside(out, out / ".." / "x")


def _vidstg_with(tmp_path: Path, **changes) -> Path:
    root = vidstg(tmp_path / "vidstg", as_video=False)
    path = root / "sent_annos" / "test_annotations.json"
    entry = json.loads(path.read_text())[0]
    entry.update(changes)
    path.write_text(json.dumps([entry]))
    return root


@pytest.mark.parametrize("vid", ["../../escape_vid", "/abs/escape_vid", "..", "a\\b"])
def test_vidstg_vid_with_a_path_is_refused(tmp_path, vid):
    root = _vidstg_with(tmp_path, vid=vid)
    out = tmp_path / "a" / "b" / "out"
    with pytest.raises(InputError, match="'vid'"):
        convert(f"vidstg:{root}", out)
    assert not (tmp_path / "a" / "escape_vid").exists() and not Path("/abs").exists()


def test_vidstg_vids_differing_only_by_unsafe_characters_get_distinct_folders(tmp_path):
    root = vidstg(tmp_path / "vidstg", as_video=False)
    path = root / "sent_annos" / "test_annotations.json"
    entry = json.loads(path.read_text())[0]
    source = root / "frames" / entry["vid"]
    entries = []
    for vid in ("v*1", "v?1", "v[1]"):  # glob characters too: each must find its own folder only
        shutil.copytree(source, root / "frames" / vid)
        shutil.copy(
            root / "annotation" / "validation" / "0000" / f"{entry['vid']}.json",
            root / "annotation" / "validation" / "0000" / f"{vid}.json",
        )
        entries.append({**entry, "vid": vid})
    shutil.rmtree(source)
    path.write_text(json.dumps(entries))
    out = tmp_path / "out"
    result = convert(f"vidstg:{root}", out)
    folders = {
        Path(json.loads(line)["video"]["frames"][0]).parent for line in result.path.read_text().splitlines()
    }
    assert len(folders) == 3 and all(f.parent == out / "frames" for f in folders)
    assert {f.name for f in (out / "frames").iterdir()} == {f.name for f in folders}


# --- B. hub ids and revisions ------------------------------------------------------------------------------

BAD_SPECS = ["org/name@../../x", "org/name@/etc", "org/name@a\\b", "org/..", "../name", "org/na..me", "a/b/c"]


@pytest.mark.parametrize("spec", BAD_SPECS)
def test_hub_ids_and_revisions_that_leave_the_cache_are_refused(spec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(CorelensError, match="revision|hub id") as model:
        corelens.load(spec, device="cpu")
    with pytest.raises(CorelensError, match="revision|hub id") as heads:
        HeadSet.load(spec)
    assert "\n" not in str(model.value) and "\n" not in str(heads.value)


def test_a_revision_climbing_out_of_refs_is_refused_before_the_cache_is_read(tmp_path, monkeypatch):
    # The cache layout huggingface_hub reads: refs/<revision> holds a commit, snapshots/<commit> the files.
    base = tmp_path / "cache" / "models--org--name"
    (base / "refs").mkdir(parents=True)
    (tmp_path / "planted").write_text("../../../elsewhere")  # what refs/../../../planted would name
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(CorelensError, match="revision '../../../planted'"):
        resolve("org/name", "../../../planted")
    for ok in ("main", "v1.0", "refs/pr/1", "fedcba9876543210fedcba9876543210fedcba98"):
        check_revision("org/name", ok)


def test_cli_refuses_a_revision_in_one_line(tmp_path, capsys):
    from corelens.organism.tasks import generate

    data = generate("image", tmp_path / "data", 1, seed=1)
    code = main(["rank", "--model", "org/name@../../x", "--data", str(data), "--out", str(tmp_path / "run")])
    assert code == 2 and "revision '../../x'" in _one_error_line(capsys)


# --- C. head-set files -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload, match",
    [
        ({"-5": [0], "0": [1]}, "entry '-5'"),
        ({"0": "12"}, "entry '0'.*list of integers"),
        ({"0": [1, 1]}, "listed twice"),
        ({"0": [0.5]}, "list of integers"),
        ({"0": [True]}, "list of integers"),
        ({"0": [9]}, "head 9 is outside"),
        ({"1.5": [0]}, "entry '1.5'"),
        ({"0-1": [1.0], "0-0": ["x"]}, "entry '0-0'.*finite numbers"),
        ({"0-0": [1.0], "-1-0": [1.0]}, "entry '-1-0'"),
    ],
)
def test_sparsemm_malformed_entries_are_refused_naming_file_and_entry(tmp_path, payload, match):
    path = tmp_path / "sparsemm_heads.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(CorelensError, match=match) as err:
        read_sparsemm(path, heads=4)
    assert str(path) in str(err.value)


def test_sparsemm_repeated_key_is_refused(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"0": [1], "0": [2]}')  # json would keep the last silently
    with pytest.raises(CorelensError, match="repeated"):
        read_sparsemm(path, heads=4)


def _peak_mib(fn) -> float:
    tracemalloc.start()
    try:
        with pytest.raises(CorelensError) as err:
            fn()
        return tracemalloc.get_traced_memory()[1] / 2**20, str(err.value)
    finally:
        tracemalloc.stop()


def test_huge_layer_and_head_claims_allocate_nothing(tmp_path):
    sparse = tmp_path / "s.json"
    sparse.write_text(json.dumps({"1000000000": [0]}))
    peak, message = _peak_mib(lambda: read_sparsemm(sparse, heads=28))
    assert peak < 20 and "more than" in message
    peak, message = _peak_mib(lambda: read_sparsemm(sparse, heads=28, layers=28))
    assert peak < 20 and "outside 0..27" in message
    scores = tmp_path / "scores.json"
    scores.write_text(json.dumps({"0-0": [1.0], "1000000000-1000000000": [1.0]}))
    peak, message = _peak_mib(lambda: read_sparsemm(scores))
    assert peak < 20 and "does not cover" in message
    duo = tmp_path / "duo"
    duo.mkdir()
    np.savetxt(duo / DUO_TSV, np.full((2, 2), 0.7), delimiter="\t")
    for claim, match in ((1e9, "positive integer"), (1_000_000_000, "more than")):
        (duo / DUO_CONFIG).write_text(json.dumps({"num_attention_heads": claim}))
        peak, message = _peak_mib(lambda: read_duo(duo))
        assert peak < 20 and match in message


def test_duo_values_must_be_numbers(tmp_path):
    (tmp_path / DUO_TSV).write_text("0.7\tnan\n0.1\t0.2\n")
    with pytest.raises(CorelensError, match="row 1, column 2"):
        read_duo(tmp_path)


def _csv(tmp_path: Path, rows: list[tuple]) -> Path:
    path = tmp_path / "heads.csv"
    pd.DataFrame(rows, columns=["layer", "head", "rank"]).to_csv(path, index=False)
    return path


@pytest.mark.parametrize(
    "rows, match",
    [
        ([(0, 0, 1), (0, 0, 2), (1, 0, 3), (1, 1, 4)], "line 3: L0H0 is listed twice"),
        ([(0, 0, 1), (0.5, 1, 2), (1, 0, 3), (1, 1, 4)], "line 3: layer 0.5 is not an integer"),
        ([(0, 0, 1), (0, 1, float("nan")), (1, 0, 3), (1, 1, 4)], "line 3: rank nan is not a finite"),
        ([(0, 0, 1), (0, 1, 2), (1, 0, 3), (2, 1, 4)], "line 5: layer 2 is outside 0..1"),
        ([(0, 0, 1), (0, "x", 2), (1, 0, 3), (1, 1, 4)], "line 3: head 'x' is not an integer"),
        ([(True, 0, 1), (False, 1, 2), (True, 0, 3), (True, 1, 4)], "line 2: layer True is not an integer"),
    ],
)
def test_heads_csv_is_checked_against_the_model(tmp_path, rows, match):
    from corelens.experiments.ablate import read_heads

    path = _csv(tmp_path, rows)
    with pytest.raises(CorelensError, match=match) as err:
        read_heads(path, SimpleNamespace(num_layers=2, num_heads=2))
    assert str(path) in str(err.value)


def _headset(folder: Path, text: str) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "headset.json").write_text(text)
    return folder


GOOD_HEADS = [{"layer": lyr, "head": hd, "rank": 1 + 2 * lyr + hd} for lyr in range(2) for hd in range(2)]


@pytest.mark.parametrize(
    "document, match",
    [
        ("[" * 200_000 + "]" * 200_000, "nested more than"),
        ("[1, 2]", "a JSON object, got list"),
        (json.dumps({"format": "corelens.headset/1", "heads": GOOD_HEADS}), "field 'model'.*missing"),
        (json.dumps({"format": "corelens.headset/1", "model": {"layers": 2, "heads": 2}}), "field 'heads'"),
        (
            json.dumps(
                {"format": "corelens.headset/1", "model": {"layers": 10**9, "heads": 10**9}, "heads": []}
            ),
            "does not cover",
        ),
        (
            json.dumps(
                {"format": "corelens.headset/1", "model": {"layers": 2.5, "heads": 2}, "heads": GOOD_HEADS}
            ),
            "model.layers must be a positive integer",
        ),
        (
            json.dumps(
                {
                    "format": "corelens.headset/1",
                    "model": {"layers": 2, "heads": 2},
                    "heads": [{**GOOD_HEADS[0], "layer": 0.5}, *GOOD_HEADS[1:]],
                }
            ),
            r"heads\[0\]: layer 0.5",
        ),
        (
            json.dumps(
                {
                    "format": "corelens.headset/1",
                    "model": {"layers": 2, "heads": 2},
                    "heads": GOOD_HEADS,
                    "keep": 9,
                }
            ),
            "keep must be",
        ),
    ],
)
def test_malformed_headset_json_is_one_line_naming_file_and_field(tmp_path, document, match):
    folder = _headset(tmp_path / "set", document)
    with pytest.raises(CorelensError, match=match) as err:
        HeadSet.load(folder)
    assert str(folder / "headset.json") in str(err.value) and "\n" not in str(err.value)


# --- D. one line for damaged inputs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"fps": "abc"}, "fps"),
        ({"fps": float("nan")}, "fps"),
        ({"width": "64"}, "width"),
        ({"frame_count": float("nan")}, "frame_count"),
        ({"used_segment": {"begin_fid": "0", "end_fid": 19}}, "used_segment.begin_fid"),
        ({"temporal_gt": {"begin_fid": 5, "end_fid": float("nan")}}, "temporal_gt.end_fid"),
        (
            {"trajectories": [[{"tid": 0, "bbox": {"xmin": "x", "ymin": 0, "xmax": 5, "ymax": 5}}]] * 20},
            "trajectories[5].bbox.xmin",
        ),
    ],
)
def test_vidstg_fields_of_the_wrong_type_are_one_line(tmp_path, capsys, changes, field):
    root = _vidstg_with(tmp_path, **changes)
    code = main(["data", "convert", f"vidstg:{root}", "--out", str(tmp_path / "out")])
    line = _one_error_line(capsys)
    assert code == 2 and f"field '{field}" in line and "test_annotations.json:1" in line


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda d: d.update(page_indices=["a", 2]), "page_indices"),
        (
            lambda d: d["questions"][0]["layout_mapping"][0].update(bbox=[float("nan"), 1, 2, 3]),
            "layout_mapping.bbox",
        ),
        (
            lambda d: d["questions"][0]["layout_mapping"][0].update(page_size=["800", 1000]),
            "layout_mapping.page_size",
        ),
        (lambda d: d["questions"][0].update(page_id=[True]), "page_id"),
    ],
)
def test_mmdocir_fields_of_the_wrong_type_are_one_line(tmp_path, capsys, change, field):
    root = mmdocir(tmp_path / "mmdocir")
    path = root / "MMDocIR_annotations.jsonl"
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    change(docs[0])
    path.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    code = main(["data", "convert", f"mmdocir:{root}", "--out", str(tmp_path / "out")])
    line = _one_error_line(capsys)
    assert code == 2 and f"field '{field}'" in line and "MMDocIR_annotations.jsonl:1" in line


def test_unknown_options_key_lists_the_known_ones(tmp_path, capsys):
    root = mmdocir(tmp_path / "mmdocir")
    code = main(
        ["data", "convert", f"mmdocir:{root}", "--out", str(tmp_path / "out"), "--options", '{"fps": 2}']
    )
    line = _one_error_line(capsys)
    assert code == 2 and "--options" in line and "'fps'" in line and "level, max_pages, pages, limit" in line


def test_a_checkpoint_asking_for_its_own_code_is_one_line(tmp_path, capsys):
    from corelens.organism.tasks import generate

    model = tmp_path / "model"
    model.mkdir()
    marker = tmp_path / "ran"
    (model / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    auto_map = {"AutoConfig": "evil.Config", "AutoModelForImageTextToText": "evil.Model"}
    (model / "config.json").write_text(json.dumps({"model_type": "evil_vlm", "auto_map": auto_map}))
    data = generate("image", tmp_path / "data", 1, seed=1)
    code = main(["rank", "--model", str(model), "--data", str(data), "--out", str(tmp_path / "run")])
    line = _one_error_line(capsys)
    assert code == 2 and "corelens does not run checkpoint code" in line and not marker.exists()


def _rank_run(folder: Path, ram: pd.DataFrame) -> Path:
    folder.mkdir(parents=True)
    ram.to_parquet(folder / "ram.parquet")
    (folder / "manifest.json").write_text(json.dumps({"command": "rank", "settings": {}}))
    pd.DataFrame(
        {"layer": [0], "head": [0], "mass": [0.1], "share": [0.1], "lift": [1.0], "rank": [1]}
    ).to_csv(folder / "heads.csv", index=False)
    np.savez(folder / "explorer.npz", maps_0=np.zeros((1, 1, 1), np.uint8))
    (folder / "explorer.json").write_text(json.dumps({"samples": []}))
    return folder


FOREIGN = pd.DataFrame(
    {"sample_id": ["s"], "layer": ["zero"], "head": [0], "mass": [0.1]}
)  # no share, lift, task


def test_a_ram_parquet_of_another_schema_is_one_line_in_every_reader(tmp_path, capsys):
    from corelens.experiments.ablate import ranking_data
    from corelens.experiments.stability import read_rank_run
    from corelens.report.explorer import explorer_data

    run = _rank_run(tmp_path / "run", FOREIGN)
    readers = {
        "report": lambda: explorer_data([run]),
        "stability": lambda: read_rank_run(run),
        "--rank-resamples": lambda: ranking_data(run / "heads.csv"),
    }
    for name, read in readers.items():
        with pytest.raises(InputError) as err:
            read()
        message = str(err.value)
        assert str(run / "ram.parquet") in message, name
        assert (
            "missing column(s)" in message
            and "share, lift" in message
            and "layer is large_string, not integer" in message
        ), name
    junk = _rank_run(tmp_path / "junk", FOREIGN)
    (junk / "ram.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(InputError, match="not a parquet file"):
        read_rank_run(junk)
    other = _rank_run(tmp_path / "other", FOREIGN)
    code = main(["stability", str(run), str(other), "--out", str(tmp_path / "st")])
    assert code == 2 and "ram.parquet" in _one_error_line(capsys)


# --- issue 43, point 2: every dataset JSON through the bounded reader ---------------------------------------

DATA = Path(__file__).parent / "data"


def _repeated(text: str) -> str:
    """The published record `text` with a key written twice (the last value would win silently in `json`)."""
    return text.replace("{", '{"split": "val", "split": "test", ', 1)


def _deep(text: str) -> str:
    """A document nested 10 000 deep (Python's json recursion limit is about 1 000) in place of `text`."""
    return "[" * 10_000 + "]" * 10_000


def _annotation_file(kind: str, root: Path) -> tuple[Path, str]:
    """Build a cheap `kind` dataset at `root`; return its annotation file and the published text it takes."""
    from dataset_fixtures import mmlongbench, refcocog_release

    if kind == "vidstg":
        root.mkdir(parents=True)
        (root / "sent_annos").mkdir()
        return root / "sent_annos" / "test_annotations.json", (
            DATA / "vidstg" / "test_annotations.json"
        ).read_text()
    if kind == "mmlongbench":
        return mmlongbench(root) / "samples.json", (DATA / "mmlongbench" / "samples.json").read_text()
    if kind == "mmdocir":
        return mmdocir(root) / "MMDocIR_annotations.jsonl", (
            DATA / "mmdocir" / "MMDocIR_annotations.jsonl"
        ).read_text()
    published = json.loads((DATA / "refcocog" / "published.json").read_text())
    text = json.dumps(
        {"images": [published["image"]], "annotations": [published["annotation"]], "categories": []}
    )
    return refcocog_release(root) / "instances.json", text


@pytest.mark.parametrize("kind", ["vidstg", "mmlongbench", "mmdocir", "refcocog"])
@pytest.mark.parametrize(
    "hostile, match",
    [
        (_repeated, "key 'split' is repeated"),
        (_deep, "nested more than 64 levels"),
        (None, "more than the 4096"),
    ],
)
def test_every_dataset_reader_bounds_its_json_and_refuses_a_repeated_key(
    tmp_path, capsys, monkeypatch, kind, hostile, match
):
    from corelens.data import jsonfile

    path, text = _annotation_file(kind, tmp_path / kind)
    if hostile is None:  # an oversized file: the bound lowered to 4 KiB, the published records are larger
        monkeypatch.setattr(jsonfile, "DATASET_MAX_BYTES", 4096)
        assert len(text) > 4096 or kind == "refcocog"
        text = text if len(text) > 4096 else text.replace("{", '{"pad": "' + "x" * 5000 + '", ', 1)
    elif kind == "mmdocir":  # JSON Lines: the first published document made hostile, the line named
        lines = text.splitlines()
        text = "\n".join([hostile(lines[0]), *lines[1:]]) + "\n"
    else:
        text = hostile(text)
    path.write_text(text)
    code = main(["data", "convert", f"{kind}:{path.parent if kind != 'vidstg' else tmp_path / kind}",
                 "--out", str(tmp_path / "out")])  # fmt: skip
    line = _one_error_line(capsys)
    assert code == 2 and match in line and path.name in line, line
    if kind == "mmdocir" and hostile is not None:
        assert f"{path.name}:1" in line


@pytest.mark.parametrize(
    "record, match",
    [
        ('{"id": "a", "id": "b", "images": ["a.png"], "question": "q"}', "key 'id' is repeated"),
        ("[" * 10_000 + "]" * 10_000, "nested more than 64 levels"),
        ('{"id": "a", "question": "' + "x" * 300 + '"}', "longer than 200 bytes"),
    ],
)
def test_a_sample_line_is_bounded_and_refuses_a_repeated_key_naming_its_line(
    tmp_path, monkeypatch, record, match
):
    from corelens.data import sample
    from corelens.data.sample import read_samples

    if "longer" in match:
        monkeypatch.setattr(sample, "MAX_LINE_BYTES", 200)
    path = tmp_path / "s.jsonl"
    noise_image(8, 8, seed=0).save(tmp_path / "a.png")
    good = '{"id": "%s", "images": ["a.png"], "question": "q"}\n'
    path.write_text(good % "ok" + record + "\n" + good % "next")
    with pytest.raises(InputError, match=match) as caught:
        read_samples(path)
    assert "s.jsonl:2" in str(caught.value) and "\n" not in str(caught.value)
    samples, skipped = read_samples(path, skip_bad=True)  # the long line read past in pieces, never whole
    assert [s.id for s in samples] == ["ok", "next"] and [s.line for s in skipped] == [2]
