"""Resource bounds (docs/methods.md#resource-limits): every crafted payload ends in one line within bounded memory.

Each case runs in a subprocess whose address space is capped with `resource.setrlimit(RLIMIT_AS)`: what the
imports alone map (measured once: torch maps a lot of virtual memory) plus `HEADROOM`. A normal tiny `rank`
needs about 1.4 GiB above its imports; the unbounded code took 2.9 to 11.5 GB on these payloads. The payloads
are generated here: a 12000 x 12000 PNG of a few KB, a 1 x 1024 image, a sample of 10,000 pages, a 100k-deep
JSON line, video rates of 1e12 and 1e-9 and a VidSTG segment of 1e12 frames.
"""

from __future__ import annotations

import functools
import json
import resource
import subprocess
import sys
from pathlib import Path

import dataset_fixtures as datasets
import pytest
from PIL import Image

from corelens.data.sample import Limits, read_samples
from corelens.errors import InputError
from corelens.organism.tasks import WORDS, generate

HEADROOM = 3 << 30  # bytes above the imports' own mapping
IMPORTS = "import torch, transformers, corelens.cli, corelens.experiments.rank"
QUESTION = {"question": "what shape is the green object ?", "answer": "green cross"}


@functools.cache
def _import_peak() -> int:
    """Virtual memory (bytes) a process maps once corelens and torch are imported."""
    code = f"{IMPORTS}\nprint([l for l in open('/proc/self/status') if l.startswith('VmPeak')][0].split()[1])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip()) * 1024


def _bounded(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `python ARGS` with the address space capped at the imports' need plus HEADROOM."""
    cap = _import_peak() + HEADROOM

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, preexec_fn=limit, cwd=cwd, timeout=900
    )


def _one_line(proc: subprocess.CompletedProcess) -> str:
    """Assert exit 2 with exactly one `corelens: error:` line and no traceback; return the line."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in lines if line.startswith("corelens: error:")]
    assert len(errors) == 1, lines
    return errors[0]


def _record(sample_id: str, images: list[str]) -> dict:
    return {"id": sample_id, "images": images, **QUESTION, "targets": [{"image": 0}]}


@pytest.fixture(scope="module")
def payloads(tmp_path_factory) -> dict[str, Path]:
    """Good organism samples plus one bad record per payload, each also alone in a file of its own."""
    from corelens.models.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("resources")
    model = build_tiny_checkpoint("qwen2_5_vl", root / "model", words=WORDS, layers=2, heads=4, kv_heads=2)
    good = generate("image", root / "data", 2, seed=3)
    folder = good.parent
    # 144 million pixels under Pillow's bomb limit (about 179 M); one bit each, it compresses to a few KB.
    Image.new("1", (12000, 12000)).save(folder / "bomb.png")
    assert (folder / "bomb.png").stat().st_size < 64_000
    Image.new("RGB", (1, 1024)).save(folder / "thin.png")
    Image.new("RGB", (4, 4)).save(folder / "tiny.png")
    bad = {
        "bomb": json.dumps(_record("bomb", ["bomb.png"])),
        "thin": json.dumps(_record("thin", ["thin.png"])),
        "pages": json.dumps(_record("pages", ["tiny.png"] * 10_000)),
        "deep": "[" * 100_000 + "]" * 100_000,
        "fps": json.dumps({"id": "fps", **QUESTION, "video": {"frames": ["tiny.png"], "fps": 1e12}}),
    }
    files = {"model": model, "good": good}
    for name, line in bad.items():
        files[name] = folder / f"{name}.jsonl"
        files[name].write_text(good.read_text().splitlines()[0] + "\n" + line + "\n")
    files["all"] = folder / "all.jsonl"
    files["all"].write_text(good.read_text() + "".join(line + "\n" for line in bad.values()))
    return files


def _rank(payloads: dict[str, Path], data: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    model, path = str(payloads["model"]), str(payloads[data])
    args = ["-m", "corelens", "rank", "--model", model, "--data", path, "--out", str(out), "--n-boot", "10"]
    return _bounded([*args, *extra])


_READ = """
import json, sys
from corelens.data.sample import Limits, read_samples
from corelens.errors import CorelensError
try:
    samples, skipped = read_samples(sys.argv[1], limits=Limits(**json.loads(sys.argv[2])))
except CorelensError as err:
    print(f"corelens: error: {err}", file=sys.stderr)
    sys.exit(2)
print(json.dumps({"ids": [s.id for s in samples], "sizes": [s.image_sizes[:1] for s in samples]}))
"""


@pytest.mark.parametrize(
    ("payload", "field", "words"),
    [
        ("bomb", "images[0]", ["12000x12000", "--max-pixels"]),
        ("pages", "images", ["10,000 images", "--max-pages"]),
        ("deep", None, ["nested more than 64 levels deep"]),
        ("fps", "video.fps", ["fps must be", "1000000000000.0"]),
    ],
)
def test_read_refuses_payload_in_one_line(payloads, payload, field, words):
    line = _one_line(_bounded(["-c", _READ, str(payloads[payload]), "{}"]))
    assert f"{payloads[payload]}:2" in line
    if field is not None:
        assert f"field {field!r}" in line
    for word in words:
        assert word in line


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_raised_limits_read_the_headers_only(payloads):
    # Raised, the bounds let the samples through; the bomb is still only measured from its header.
    for payload, limits in (("bomb", {"max_pixels": 200_000_000}), ("pages", {"max_pages": 20_000})):
        proc = _bounded(["-c", _READ, str(payloads[payload]), json.dumps(limits)])
        assert proc.returncode == 0, proc.stderr[-3000:]
        read = json.loads(proc.stdout)
        assert read["ids"][1] == payload
    assert read_samples(payloads["bomb"], limits=Limits(max_pixels=144_000_000))[0][1].image_sizes == (
        (12000, 12000),
    )
    with pytest.raises(InputError, match="--max-pixels"):
        read_samples(payloads["bomb"], limits=Limits(max_pixels=143_999_999))


def test_rank_refuses_a_pixel_bomb_in_one_line(payloads, tmp_path):
    line = _one_line(_rank(payloads, "bomb", tmp_path / "run"))
    assert "sample 'bomb'" in line and "field 'images[0]'" in line and "--max-pixels" in line


@pytest.mark.e2e
def test_rank_names_an_image_the_processor_rejects(payloads, tmp_path):
    line = _one_line(_rank(payloads, "thin", tmp_path / "run"))
    assert "thin.jsonl:2" in line and "sample 'thin'" in line and "field 'images'" in line
    assert "aspect ratio" in line


@pytest.mark.e2e
def test_skip_bad_skips_every_payload_and_ranks_the_rest(payloads, tmp_path):
    out = tmp_path / "run"
    proc = _rank(payloads, "all", out, "--skip-bad", "--overlays", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    skipped = {r.get("sample_id") or r["id"]: r["error"] for r in records if r["status"] == "skipped"}
    assert "--max-pixels" in skipped["bomb"] and "--max-pages" in skipped["pages"]
    assert "aspect ratio" in skipped["thin"] and "video.fps" in skipped["fps"]
    deep = [error for key, error in skipped.items() if "nested more than 64 levels deep" in error]
    assert len(deep) == 1 and "all.jsonl:6" in deep[0]
    assert sorted(r["id"] for r in records if r["status"] == "ok") == ["image-00000", "image-00001"]
    # The overlays drew the two ranked samples (from a bounded preview).
    assert len(list((out / "figures").glob("overlay-*.png"))) == 2


_TIMES = """
from corelens.data.sample import sample_times
times = sample_times(3600.0, 1e12, 16)
assert len(times) == 16 and times[0] == 0.0 and abs(times[-1] - 3600.0) < 1e-3, times
print("ok")
"""


def test_sampling_times_are_not_materialised():
    # The whole grid would be 3.6e15 floats; only the 16 kept times may be computed.
    proc = _bounded(["-c", _TIMES])
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


_PROBE = """
import torch
from corelens.attention.dispatch import AttentionCall
from corelens.attention.probes import RamProbe
kv, views, per = 61_000, 10_000, 6
torch.manual_seed(0)
q = torch.randn(1, 2, kv, 4); k = torch.randn(1, 1, kv, 4)
pages = [torch.arange(100 + per * i, 100 + per * (i + 1)) for i in range(views)]
probe = RamProbe(1, 2, torch.tensor([kv - 2, kv - 1]), torch.arange(100, 112), torch.arange(100, 100 + per * views),
                 kv, views=pages)
probe.pre(AttentionCall(torch.nn.Identity(), 0, q, k, k, None, 0.5))
mass = probe.view_mass[0]
assert mass.shape == (2, views, 2)
assert torch.allclose(mass[:, :, 0].sum(-1), probe.visual_mass[0], atol=1e-4)
assert torch.allclose(mass[:, :2, 1].sum(-1), probe.mass[0], atol=1e-5)
assert (mass[:, 2:, 1] == 0).all()
print("ok")
"""


def test_probe_bookkeeping_is_linear_in_pages():
    # 10,000 pages over 61,000 keys: a keys x views indicator would take 4.9 GB.
    proc = _bounded(["-c", _PROBE])
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def _vidstg(root: Path, *changes: dict) -> Path:
    """The fixture's VidSTG folder: one entry per change of the fixture's entry, then that entry unchanged."""
    datasets.vidstg(root, as_video=False)
    path = root / "sent_annos" / "test_annotations.json"
    entry = json.loads(path.read_text())[0]
    bad = [{**entry, **change} for change in changes]
    path.write_text(json.dumps([*bad, entry]))
    return root


def _convert(root: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return _bounded(["-m", "corelens", "data", "convert", f"vidstg:{root}", "--out", str(out), *extra])


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"fps": 1e-9}, "fps"),
        ({"used_segment": {"begin_fid": 0, "end_fid": 10**12}}, "used_segment"),
        ({"fps": 1e12}, "fps"),
    ],
)
def test_vidstg_rates_and_segments_end_in_one_line(tmp_path, change, field):
    line = _one_line(_convert(_vidstg(tmp_path / "src", change), tmp_path / "out"))
    assert "test_annotations.json:1" in line and f"field {field!r}" in line


def test_vidstg_skip_bad_lists_the_bad_entries(tmp_path):
    changes = ({"fps": 1e-9}, {"used_segment": {"begin_fid": 0, "end_fid": 10**12}})
    out = tmp_path / "out"
    proc = _convert(_vidstg(tmp_path / "src", *changes), out, "--skip-bad")
    assert proc.returncode == 0, proc.stderr[-3000:]
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert ["field 'fps'" in skipped[0]["error"], "field 'used_segment'" in skipped[1]["error"]] == [
        True,
        True,
    ]
    assert len((out / "vidstg.jsonl").read_text().splitlines()) == 2  # the good entry's caption and question
