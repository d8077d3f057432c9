"""The edges of the security rules (issue 43): links planted beside an export, inside a run a report reads or
in a converted dataset's folder; policy files of the wrong types, repeated keys, too big or too deep. Each
case ends in one line naming the link, file or field, with nothing read or written outside the named folder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from corelens.cli import main
from corelens.errors import CorelensError
from corelens.organism.tasks import WORDS, generate


@pytest.fixture(scope="module")
def rank_run(tmp_path_factory):
    from corelens.models.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("edges")
    model = build_tiny_checkpoint("qwen2_5_vl", root / "model", words=WORDS, layers=2, heads=4, kv_heads=2)
    data = generate("image", root / "data", 3, seed=5)
    run = root / "run"
    argv = ["rank", "--model", str(model), "--data", str(data), "--out", str(run), "--overlays", "0"]
    assert main(argv) == 0
    return {"model": model, "data": data, "run": run}


def _one_line(capsys, *names: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("corelens: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(name in lines[0] for name in names), lines[0]
    return lines[0]


# --- 1. one safe-path rule: export, report, convert ---------------------------------------------------------


@pytest.mark.parametrize("name", ["headset.json", "heads.csv", "manifest.json", "README.md"])
def test_export_does_not_write_through_a_planted_link(rank_run, tmp_path, capsys, name):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (out / name).symlink_to(victim)
    assert main(["export", str(rank_run["run"]), "--out", str(out)]) == 2
    _one_line(capsys, str(out / name), "link")
    assert victim.read_text() == "precious\n" and (out / name).is_symlink()


@pytest.mark.parametrize(("to", "folder"), [("duo", "duo_attention"), ("sparsemm", "visual_head")])
def test_export_writes_nothing_into_a_linked_folder_outside_out(rank_run, tmp_path, capsys, to, folder):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / folder).symlink_to(elsewhere)
    assert main(["export", str(rank_run["run"]), "--out", str(out), "--keep", "2", "--to", to]) == 2
    _one_line(capsys, str(out / folder), "outside")
    assert list(elsewhere.iterdir()) == []


def test_export_reads_no_file_linked_out_of_the_run(rank_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(rank_run["run"], run)
    secret = tmp_path / "secret.csv"
    shutil.copy(run / "heads.csv", secret)
    (run / "heads.csv").unlink()
    (run / "heads.csv").symlink_to(secret)
    assert main(["export", str(run), "--out", str(tmp_path / "out")]) == 2
    _one_line(capsys, str(run / "heads.csv"), "outside")


def test_a_link_that_stays_inside_the_run_is_read(rank_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(rank_run["run"], run)
    (run / "heads.csv").rename(run / "heads-real.csv")
    (run / "heads.csv").symlink_to("heads-real.csv")
    assert main(["export", str(run), "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("name", ["figures/linked.png", "linked.csv", "figures/sub"])
def test_report_embeds_no_file_linked_out_of_the_run(rank_run, tmp_path, capsys, name):
    run = tmp_path / "run"
    shutil.copytree(rank_run["run"], run)
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "secret.png").write_bytes((rank_run["run"] / "figures" / "heads_mass.png").read_bytes())
    (secret / "secret.csv").write_text("password\nhunter2\n")
    target = secret if name == "figures/sub" else secret / f"secret{Path(name).suffix}"
    (run / name).symlink_to(target)
    page = tmp_path / "r.html"
    assert main(["report", str(run), "--out", str(page)]) == 2
    _one_line(capsys, str(run / name), "outside")
    assert not page.exists()


def test_report_of_a_manifest_that_is_a_list_is_one_line(rank_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(rank_run["run"], run)
    (run / "manifest.json").write_text("[1, 2]")
    assert main(["report", str(run), "--out", str(tmp_path / "r.html")]) == 2
    _one_line(capsys, str(run / "manifest.json"), "not a corelens manifest")


def test_convert_and_run_folders_share_the_one_rule(tmp_path):
    from corelens.data.paths import inside
    from corelens.errors import InputError
    from corelens.runs.files import UnsafePath, write_text

    out, elsewhere, victim = tmp_path / "out", tmp_path / "elsewhere", tmp_path / "victim.txt"
    out.mkdir()
    elsewhere.mkdir()
    victim.write_text("precious\n")
    (out / "pages").symlink_to(elsewhere)
    (out / "skipped.jsonl").symlink_to(victim)
    with pytest.raises(UnsafePath, match=f"{out / 'pages'}: a link to .*outside") as err:
        inside(out, out / "pages" / "doc")
    assert isinstance(err.value, InputError)
    with pytest.raises(UnsafePath, match="link"):
        write_text(out / "skipped.jsonl", "x", root=out)
    assert victim.read_text() == "precious\n" and list(elsewhere.iterdir()) == []


# --- 2. policy files through the registry's schema -----------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"name": "zero", "heads": ["05", "17"]}, "field 'heads[0]'"),
        ({"name": "zero", "heads": [["0", "5"]]}, "field 'heads[0][0]'"),
        ({"name": "zero", "heads": [[0.0, 5]]}, "field 'heads[0][0]'"),
        ({"name": "zero", "heads": [[0, 5.5]]}, "field 'heads[0][1]'"),
        ({"name": "zero", "heads": [[True, 1]]}, "field 'heads[0][0]'"),
        ({"name": "zero", "heads": "0-5"}, "field 'heads'"),
        ({"name": "zero", "heads": [[0, 1]], "seed": 2.0}, "field 'seed'"),
        ({"name": ["zero"], "heads": [[0, 1]]}, "field 'name'"),
        ({"name": "nope"}, "field 'name'"),
        ({"name": "mean", "heads": [[0, 1]], "label": 3}, "field 'label'"),
        ({"name": "sap", "prior": "noise", "layers": 1}, "field 'layers'"),
        ({"name": "hybrid", "full": [[0, "1"]]}, "field 'full[0][1]'"),
    ],
)
def test_policy_json_of_the_wrong_type_is_one_line_in_every_reader(doc, field, tmp_path):
    from corelens.integrations.kvpress import PolicyPress
    from corelens.integrations.lmms_eval.policy import load_policy
    from corelens.policies import Policy

    path = tmp_path / "policy.json"
    path.write_text(json.dumps(doc))
    readers = [load_policy, Policy.from_file, PolicyPress]
    for read in readers:
        with pytest.raises(CorelensError) as err:
            read(path)
        message = str(err.value)
        assert str(path) in message and field in message and "\n" not in message, (read, message)
    with pytest.raises(CorelensError, match=field.replace("[", r"\[").replace("]", r"\]")):
        Policy.from_json(json.dumps(doc))


def test_every_registered_policy_round_trips_through_its_checked_json():
    from corelens.policies import POLICIES, Policy

    for name, cls in POLICIES.items():
        policy = cls()
        assert Policy.from_json(policy.to_json()) == policy, name


def test_heads_given_as_integer_pairs_are_read():
    from corelens.policies import Policy, ZeroHeads

    policy = Policy.from_json('{"name": "zero", "heads": [[1, 0], [0, 5]]}')
    assert policy == ZeroHeads(heads=((0, 5), (1, 0)))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"name": "zero", "name": "mean"}', "key 'name' is repeated"),
        ('{"name": "zero", "heads": [[0, 1]], "heads": [[1, 1]]}', "key 'heads' is repeated"),
        ("[" * 5000 + "]" * 5000, "nested more than"),
        ('{"name": "zero", "heads": [[0, 1]]', "not valid JSON"),
    ],
)
def test_repeated_keys_deep_nesting_and_bad_json_are_one_line(text, message, tmp_path):
    from corelens.integrations.lmms_eval.policy import load_policy
    from corelens.policies import Policy

    path = tmp_path / "policy.json"
    path.write_text(text)
    for read in (load_policy, Policy.from_file):
        with pytest.raises(CorelensError, match=message) as err:
            read(path)
        assert str(path) in str(err.value)


def test_a_headset_with_a_repeated_key_is_refused(rank_run, tmp_path, capsys):
    out = tmp_path / "set"
    assert main(["export", str(rank_run["run"]), "--out", str(out)]) == 0
    text = (out / "headset.json").read_text()
    (out / "headset.json").write_text(
        text.replace('{\n  "format"', '{\n  "keep": 1,\n  "keep": null,\n  "format"', 1)
    )
    from corelens.heads import HeadSet

    with pytest.raises(CorelensError, match="key 'keep' is repeated"):
        HeadSet.load(out)


def test_an_oversized_json_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from corelens.data import jsonfile

    path = tmp_path / "headset.json"
    path.write_text(json.dumps({"pad": "x" * 5000}))
    monkeypatch.setattr(jsonfile, "MAX_BYTES", 1000)
    with pytest.raises(CorelensError, match="more than the 1000"):
        jsonfile.load(path, max_bytes=jsonfile.MAX_BYTES)
    with pytest.raises(CorelensError, match="more than the 1000"):
        jsonfile.loads(path.read_text(), path, max_bytes=1000)


# --- 3. bounds and one line -----------------------------------------------------------------------------------

TAKER = """
import sys, time
from pathlib import Path
import corelens.runs.lock
from corelens.runs.lock import Lock, Locked
corelens.runs.lock.warn = lambda message: time.sleep(0.3)  # a slow terminal: the window between look and act
lock = Lock(sys.argv[1])
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))  # all start taking at the same moment
try:
    lock.acquire()
except Locked:
    print("refused", flush=True)
else:
    print("won", flush=True)
    while not Path(sys.argv[3]).exists():  # hold it until every other taker has been answered
        time.sleep(0.05)
"""


@pytest.mark.e2e
def test_a_stale_lock_is_taken_over_by_exactly_one_of_many_takers(tmp_path):
    """A killed run's lock found by 12 processes at once: one takes it over, every other is refused."""
    import os
    import socket
    import subprocess
    import sys
    import time

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    for trial in range(3):
        run = tmp_path / f"run{trial}"
        run.mkdir()
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        holder = {"pid": dead.pid, "host": socket.gethostname(), "started": "2026-01-01T00:00:00+0000"}
        (run / "run.lock").write_text(json.dumps(holder))
        start, stop = time.time() + 4.0, tmp_path / f"stop{trial}"
        takers = [
            subprocess.Popen(
                [sys.executable, "-c", TAKER, str(run), str(start), str(stop)],
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )  # fmt: skip
            for _ in range(12)
        ]
        deadline = time.time() + 120
        while sum(t.poll() is not None for t in takers) < 11 and time.time() < deadline:
            time.sleep(0.05)
        stop.touch()
        said = [t.communicate(timeout=60)[0].strip() for t in takers]
        assert sorted(said) == ["refused"] * 11 + ["won"], said


def _rank_again(rank_run, run, *extra) -> int:
    argv = ["rank", "--model", str(rank_run["model"]), "--data", str(rank_run["data"]), "--out", str(run)]
    return main([*argv, "--overlays", "0", *extra])


def test_a_log_record_with_a_mass_of_the_wrong_shape_is_one_line(rank_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(rank_run["run"], run)
    lines = (run / "samples.jsonl").read_text().splitlines(keepends=True)
    record = json.loads(lines[1])
    record["mass"] = record["mass"][0]  # one layer's row instead of layers x heads
    lines[1] = json.dumps(record) + "\n"
    (run / "samples.jsonl").write_text("".join(lines))
    assert _rank_again(rank_run, run) == 2
    _one_line(capsys, f"{run / 'samples.jsonl'}:2", "field 'mass'", "2 x 4")


def test_a_full_disk_is_one_line_and_the_resume_is_identical(rank_run, tmp_path, capsys, monkeypatch):
    """ENOSPC while a run writes: one line; run again, and the result is the uninterrupted run's."""
    import errno
    import os

    run = tmp_path / "run"
    shutil.copytree(rank_run["run"], run)
    lines = (run / "samples.jsonl").read_bytes().splitlines(keepends=True)
    (run / "samples.jsonl").write_bytes(b"".join(lines[:-1]))
    (run / "heads.csv").unlink()
    fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    assert _rank_again(rank_run, run) == 2
    line = _one_line(capsys, "disk full while writing", "nothing finished is lost; rerun to resume")
    assert str(run) in line and not list(run.glob(".*.tmp"))
    monkeypatch.setattr(os, "fsync", fsync)
    assert _rank_again(rank_run, run) == 0, capsys.readouterr().err
    base = rank_run["run"]
    assert (run / "samples.jsonl").read_bytes() == (base / "samples.jsonl").read_bytes()
    assert (run / "heads.csv").read_bytes() == (base / "heads.csv").read_bytes()


@pytest.mark.parametrize(("column", "value"), [("layer", 100_000_000), ("head", -1), ("layer", 0.5)])
def test_report_of_a_heads_table_with_an_absurd_layer_is_one_line(rank_run, tmp_path, capsys, column, value):
    import pandas as pd

    run = tmp_path / "run"
    shutil.copytree(rank_run["run"], run)
    table = pd.read_csv(run / "heads.csv")
    table[column] = table[column].astype(object)
    table.loc[3, column] = value
    table.to_csv(run / "heads.csv", index=False)
    page = tmp_path / "r.html"
    assert main(["report", str(run), "--out", str(page)]) == 2
    _one_line(capsys, str(run / "heads.csv"), "line 5", column)
    assert not page.exists()


def test_control_characters_from_data_reach_the_terminal_escaped(tmp_path, capsys):
    """A task label carrying escape sequences (set the window title, clear the screen) is printed escaped."""
    samples = generate("image", tmp_path / "data", 2, seed=1)
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    for record in records:
        record["task"] = "t\x1b]0;owned\x07\x1b[2Jx"
    samples.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["data", "stats", str(samples), "--out", str(tmp_path / "stats.json")]) == 0
    printed = "".join(capsys.readouterr())
    assert "\x1b" not in printed and "\x07" not in printed, printed
    assert "t\\x1b]0;owned\\x07\\x1b[2Jx" in printed, printed


# --- 6. identity with judgement -------------------------------------------------------------------------------


def _variant(model: Path, out: Path, change) -> Path:
    """A copy of checkpoint `model` whose config.json `change(config)` edits."""
    shutil.copytree(model, out)
    config = json.loads((out / "config.json").read_text())
    change(config)
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def exported(rank_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("set") / "set"
    assert main(["export", str(rank_run["run"]), "--out", str(out), "--keep", "2"]) == 0
    return out


def test_a_changed_initializer_range_or_a_bf16_resave_is_a_recorded_warning(
    rank_run, exported, tmp_path, capsys
):
    import torch

    import corelens
    from corelens.heads import HeadSet

    hs = HeadSet.load(exported)
    changed = _variant(
        rank_run["model"], tmp_path / "init", lambda c: c["text_config"].update(initializer_range=0.5)
    )
    m = corelens.load(changed, device="cpu")
    notes = hs.check(m)
    assert notes and "initializer_range: 0.02 -> 0.5" in notes[0] and m.identity_notes == notes
    assert "its heads hold" in capsys.readouterr().err

    resaved = tmp_path / "bf16"
    shutil.copytree(rank_run["model"], resaved)
    base = corelens.load(rank_run["model"], device="cpu").model.to(torch.bfloat16)
    base.save_pretrained(resaved)
    notes = hs.check(corelens.load(resaved, device="cpu"))
    assert notes and "tensor dtypes" in notes[0] and "F32 -> BF16" in notes[0], notes


def test_a_changed_rope_is_refused_unless_allowed_and_then_recorded(rank_run, exported, tmp_path, capsys):
    import corelens
    from corelens.heads import HeadSet

    hs = HeadSet.load(exported)

    def rope(config):
        config["text_config"]["rope_parameters"]["rope_theta"] = 5e5

    other = _variant(rank_run["model"], tmp_path / "rope", rope)
    with pytest.raises(CorelensError, match="rope_theta.*--allow-other-model"):
        hs.check(corelens.load(other, device="cpu"))
    m = corelens.load(other, device="cpu", strict=False)
    notes = hs.check(m)
    assert notes and "another model used (--allow-other-model)" in notes[0] and "rope_theta" in notes[0]
    capsys.readouterr()

    argv = ["ablate", "--model", str(other), "--data", str(rank_run["data"]), "--heads", str(exported),
            "--out", str(tmp_path / "ablate"), "--k", "1", "--sets", "top", "--max-new-tokens", "1"]  # fmt: skip
    assert main(argv) == 2
    _one_line(capsys, "rope_theta", "--allow-other-model")
    assert main([*argv, "--allow-other-model"]) == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "ablate" / "manifest.json").read_text())
    assert "rope_theta" in " ".join(manifest["settings"]["model_identity_notes"])


def test_the_same_config_with_other_weights_is_refused_unless_allowed(rank_run, exported, tmp_path, capsys):
    """Another seed of the same config and shapes, or a small fine-tune (every weight moved by 0.1 %, far
    less than a bf16 re-save's rounding would hide in another dtype, but the same dtype): the weights' content
    refuses; `strict=False` uses the set with the note."""
    import torch
    from safetensors.torch import load_file, save_file

    import corelens
    from corelens.heads import HeadSet
    from corelens.models.tiny import build_tiny_checkpoint

    hs = HeadSet.load(exported)
    seed = build_tiny_checkpoint("qwen2_5_vl", tmp_path / "seed1", words=WORDS, layers=2, heads=4, kv_heads=2,
                                 seed=1)  # fmt: skip
    tuned = tmp_path / "tuned"
    shutil.copytree(rank_run["model"], tuned)
    tensors = load_file(tuned / "model.safetensors")
    tensors = {k: v * 1.001 if v.is_floating_point() else v for k, v in tensors.items()}
    save_file(tensors, tuned / "model.safetensors", metadata={"format": "pt"})
    for other in (seed, tuned):
        assert json.loads((other / "config.json").read_text()) == json.loads(
            (rank_run["model"] / "config.json").read_text()
        )
        with pytest.raises(CorelensError, match="weights' content of tensor .* differs.*--allow-other-model"):
            hs.check(corelens.load(other, device="cpu"))
        with pytest.raises(CorelensError, match="weights' content"):
            hs.check(other)  # the checkpoint read without its weights: slices only
        m = corelens.load(other, device="cpu", strict=False)
        notes = hs.check(m)
        assert (
            notes
            and "another model used (--allow-other-model)" in notes[0]
            and "weights' content" in notes[0]
        )
    capsys.readouterr()
    # The same weights in bf16 agree within its rounding: a note, never a refusal (the test above names it).
    resaved = tmp_path / "bf16"
    shutil.copytree(rank_run["model"], resaved)
    corelens.load(rank_run["model"], device="cpu").model.to(torch.bfloat16).save_pretrained(resaved)
    notes = hs.check(corelens.load(resaved, device="cpu"))
    assert len(notes) == 1 and "tensor dtypes" in notes[0] and "content" not in notes[0], notes


# --- 7. your own model in one call ----------------------------------------------------------------------------


def test_your_own_model_in_one_call(rank_run, caplog):
    """`cl.Loaded.from_model(model, processor, "path")` with a str path; `cl.rank` and `cl.answer` take the bare
    model (its processor read from its folder), switched to corelens' attention with the note."""
    from transformers import AutoModelForImageTextToText

    import corelens as cl
    from corelens.data import read_samples

    path = str(rank_run["model"])
    model = AutoModelForImageTextToText.from_pretrained(path, attn_implementation="sdpa")
    with caplog.at_level("WARNING"):
        m = cl.Loaded.from_model(model, path=path)
    assert isinstance(m.path, Path) and m.processor is not None and "switched from 'sdpa'" in caplog.text
    assert m.identity()["digest"] == cl.load(path, device="cpu").identity()["digest"]

    bare = AutoModelForImageTextToText.from_pretrained(path, attn_implementation="sdpa")
    ranking = cl.rank(bare, rank_run["data"], query="answer")
    assert ranking.top(2) == cl.rank(m, rank_run["data"], query="answer").top(2)
    samples, _ = read_samples(rank_run["data"])
    prepared = cl.prepare(m, samples[0])
    assert cl.answer(bare, prepared) == cl.answer(m, prepared)


def test_a_model_corelens_cannot_take_is_one_line():
    import torch

    import corelens as cl
    from corelens.errors import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="corelens.rank takes a corelens.Loaded"):
        cl.rank(torch.nn.Linear(2, 2), "data.jsonl")
    with pytest.raises(UnsupportedModelError, match="not a transformers model"):
        cl.Loaded.from_model(object())
