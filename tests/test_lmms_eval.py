"""lmms-eval with the corelens model: docs/integrations.md's command on a local task, offline, on the organism.

Unmodified, the model answers as corelens' own harness (given the harness's prompt and pixel bounds) and as
lmms-eval's own `qwen2_5_vl` model (with that model's defaults); under a policy it answers as `corelens
ablate`, `corelens hybrid` and `corelens sap` do under the same policy; `accelerate launch` and `torchrun`
with 2 processes split the documents and give the same answers.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import pandas as pd
import pytest
from helpers import register_toy_policy
from PIL import Image

import corelens
from corelens.cli import main
from corelens.data import read_samples
from corelens.experiments.evaluate import answer
from corelens.organism import organism_path
from corelens.organism.tasks import generate

pytestmark = pytest.mark.e2e  # whole workflows: `make check` leaves this file out

pytest.importorskip("lmms_eval", reason="the lmms extra is not installed")
from corelens.integrations.lmms_eval.__main__ import main as write_task_main  # noqa: E402

N = 6
TASK_DIR = "my tasks #1/organism"
# corelens' own commands prompt with no system turn and the checkpoint's pixel bounds (the organism's
# processor: 3136 to 50176 pixels); qwen2_5_vl's defaults differ (a system prompt, 200704 to 1605632 pixels).
HARNESS = "system_prompt=,min_pixels=3136,max_pixels=50176,visual_prep=corelens"


ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Heads ranked on one split, a local lmms-eval task over another split, and the harness's answers."""
    root = tmp_path_factory.mktemp("lmms")
    ident = generate("image", root / "ident", 8, seed=11)
    data = generate("image", root / "eval", N, seed=12)
    run = root / "rank"
    assert main(["rank", "--model", str(organism_path()), "--data", str(ident), "--out", str(run),
                 "--query", "answer", "--overlays", "0"]) == 0  # fmt: skip
    # A task folder whose path holds spaces and '#' (the YAML is written by PyYAML, never cut there).
    assert write_task_main([str(data), "--out", str(root / TASK_DIR), "--task", "organism_image"]) == 0
    samples, _ = read_samples(data)
    m = corelens.load(organism_path(), device="cpu")
    harness = [answer(m, s, max_new_tokens=8) for s in samples]
    return {"root": root, "data": data, "heads": run / "heads.csv", "samples": samples, "harness": harness}


def _model_args(model_args: str) -> str:
    return f"pretrained={organism_path()},device=cpu,{HARNESS}" + (f",{model_args}" if model_args else "")


def _read(out) -> tuple[list[str], float]:
    """Return the answers by document and the accuracy that lmms-eval logged under `out`."""
    logged = sorted(out.glob("*/*_samples_organism_image.jsonl"))
    assert logged, f"lmms-eval wrote no samples under {out}"  # it exits 0 after logging an error
    rows = [json.loads(line) for line in logged[-1].read_text().splitlines()]
    results = json.loads(sorted(out.glob("*/*_results.json"))[-1].read_text())
    answers = [r["filtered_resps"] for r in sorted(rows, key=lambda r: r["doc_id"])]
    answers = [a[0] if isinstance(a, list) else a for a in answers]
    return answers, results["results"]["organism_image"]["accuracy,none"]


def _run(args: list[str], launcher: tuple[str, ...] = (sys.executable,), env: dict | None = None) -> str:
    """Run lmms-eval's command line (under `launcher`); return its log (stdout and stderr)."""
    proc = subprocess.run([*launcher, "-m", "lmms_eval", *args], capture_output=True, text=True,
                          env={**ENV, **(env or {})},
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def policies(setup):
    """The same policies run by corelens' own commands and, in one lmms-eval call, by the corelens model.

    One call of lmms-eval evaluates every policy (a `--config` file listing one evaluation each), so its
    start-up (about 20 s of imports here) is paid once. Returns {tag: (corelens' answers, lmms-eval's answers)}.
    """
    root, data, heads = setup["root"], str(setup["data"]), str(setup["heads"])
    model = ["--model", str(organism_path()), "--data", data]
    assert main(["ablate", *model, "--heads", heads, "--out", str(root / "ablate"), "--k", "8", "--sets", "top",
                 "--op", "zero"]) == 0  # fmt: skip
    assert main(["hybrid", *model, "--heads", heads, "--out", str(root / "hybrid"), "--keep", "2", "--sets",
                 "top", "--sink", "1", "--window", "2"]) == 0  # fmt: skip
    assert main(["sap", *model, "--out", str(root / "sap"), "--prior", "noise", "--layers", "0-3"]) == 0
    ablated = pd.read_parquet(root / "ablate" / "records.parquet")
    hybrid = pd.read_parquet(root / "hybrid" / "records.parquet")
    sap = pd.read_parquet(root / "sap" / "sap.parquet")
    ours = {
        "ablate": ablated[ablated["condition"] == "top/8"].set_index("sample")["prediction"],
        "hybrid-file": hybrid[hybrid["condition"].str.startswith("top")].set_index("sample")["prediction"],
        "sap": sap[sap["condition"] == "noise@0-3"].set_index("sample_id")["prediction"],
    }
    ours["hybrid-args"] = ours["hybrid-file"]
    policy = json.loads((root / "hybrid" / "policies.json").read_text())
    path = root / "hybrid-policy.json"
    path.write_text(json.dumps(next(p for p in policy if p["name"].startswith("top"))["policy"]))
    model_args = {
        "ablate": f"heads={heads},k=8,op=zero",
        "hybrid-file": f"policy={path}",
        "hybrid-args": f"full={heads},keep=2,sink=1,window=2",
        "sap": "prior=noise,layers=0-3",
    }
    config = [
        {"model": "corelens", "model_args": _model_args(args), "tasks": "organism_image",
         "include_path": str(root / TASK_DIR), "output_path": str(root / f"lmms-{tag}"), "log_samples": True}
        for tag, args in model_args.items()
    ]  # fmt: skip
    (root / "policies.yaml").write_text(json.dumps(config))  # JSON is YAML
    _run(["--config", str(root / "policies.yaml")])
    return {
        tag: ([ours[tag][s.id] for s in setup["samples"]], _read(root / f"lmms-{tag}")[0])
        for tag in model_args
    }


def test_unmodified_model_answers_as_the_harness(setup):
    """The command of docs/integrations.md, as typed."""
    out = setup["root"] / "lmms-plain"
    _run(["--model", "corelens", "--model_args", _model_args(""), "--tasks", "organism_image", "--include_path",
          str(setup["root"] / TASK_DIR), "--output_path", str(out), "--log_samples"])  # fmt: skip
    answers, accuracy = _read(out)
    assert answers == setup["harness"]
    gold = [s.answer for s in setup["samples"]]
    assert accuracy == pytest.approx(sum(a == g for a, g in zip(answers, gold)) / N)


@pytest.mark.parametrize("tag", ["ablate", "hybrid-file", "hybrid-args", "sap"])
def test_policy_answers_as_the_corelens_command(setup, policies, tag):
    expected, answers = policies[tag]
    assert answers == expected
    assert answers != setup["harness"]  # the policy changes answers


def test_bad_arguments_are_refused(setup, tmp_path):
    from corelens.errors import CorelensError
    from corelens.integrations.lmms_eval.model import Corelens

    with pytest.raises(CorelensError, match="unknown corelens model argument"):
        Corelens(str(organism_path()), device="cpu", window_size=3)
    with pytest.raises(CorelensError, match="one policy"):
        Corelens(str(organism_path()), device="cpu", heads=str(setup["heads"]), prior="noise")
    bad = tmp_path / "p.json"
    bad.write_text("{}")
    with pytest.raises(CorelensError, match="not a hybrid policy"):
        Corelens(str(organism_path()), device="cpu", policy=str(bad))


BIN = os.path.dirname(sys.executable)


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


# 2 CPU processes over gloo. accelerate's `--cpu` starts one process; `--multi_gpu` on a machine without a
# visible GPU starts 2 and Accelerator() gives each the CPU and gloo.
LAUNCHERS = {
    "accelerate": lambda: (f"{BIN}/accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
                           "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
                           _free_port()),
    "torchrun": lambda: (f"{BIN}/torchrun", "--standalone", "--nproc_per_node", "2"),
}  # fmt: skip


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_two_processes_split_the_documents(setup, launcher):
    """`accelerate launch` / `torchrun` with 2 CPU processes (gloo): each answers its share, same answers."""
    out = setup["root"] / f"lmms-{launcher}"
    log = _run(["--model", "corelens", "--model_args", _model_args(""), "--tasks", "organism_image",
                "--include_path", str(setup["root"] / TASK_DIR), "--output_path", str(out), "--log_samples"],
               LAUNCHERS[launcher](), {"CUDA_VISIBLE_DEVICES": ""})  # fmt: skip
    for rank in (0, 1):
        assert f"corelens: process {rank} of 2 on cpu: {N // 2} requests" in log
    answers, _ = _read(out)
    assert answers == setup["harness"]


def _requests(task: str, docs: list[dict], gen_kwargs: dict, visual) -> tuple[dict, list]:
    """Return lmms-eval's task_dict and the generate_until requests of `docs` (as lmms-eval builds them)."""
    from lmms_eval.api.instance import Instance

    requests = [
        Instance("generate_until", (doc["question"], dict(gen_kwargs), visual, i, task, "test"), i,
                 {"task": task, "doc_id": i, "repeats": 1})
        for i, doc in enumerate(docs)
    ]  # fmt: skip
    return {task: {"test": docs}}, requests


def _answers(model, task_dict, requests) -> list[str]:
    model.task_dict = task_dict
    return model.generate_until(requests)


POPE_KWARGS = {"max_new_tokens": 8, "temperature": 0, "top_p": 1.0, "num_beams": 1, "do_sample": False}


def test_no_policy_answers_as_lmms_evals_qwen2_5_vl(setup):
    """The stock qwen2_5_vl class and the corelens model, same arguments, same requests: the same answers."""
    pytest.importorskip("qwen_vl_utils", reason="lmms-eval's qwen2_5_vl needs qwen-vl-utils")
    pytest.importorskip("decord", reason="lmms-eval's qwen2_5_vl imports decord")
    from lmms_eval.models.simple.qwen2_5_vl import Qwen2_5_VL
    from PIL import Image

    from corelens.integrations.lmms_eval.model import Corelens

    docs = [{"question": s.question, "image": str(s.images[0])} for s in setup["samples"]]
    task_dict, requests = _requests(
        "stock", docs, POPE_KWARGS, lambda doc: [Image.open(doc["image"]).convert("RGB")]
    )
    got = {}
    # qwen2_5_vl's defaults (a system prompt, 200704 to 1605632 pixels), then other bounds and prompt.
    for tag, args in {"defaults": {}, "set": {"system_prompt": "Answer briefly.", "min_pixels": 3136,
                                              "max_pixels": 50176}}.items():  # fmt: skip
        stock = _answers(Qwen2_5_VL(str(organism_path()), device="cpu", device_map="cpu", **args), task_dict,
                         requests)  # fmt: skip
        ours = _answers(Corelens(str(organism_path()), device="cpu", dtype="bfloat16", **args), task_dict,
                        requests)  # fmt: skip
        assert ours == stock, tag
        got[tag] = ours
    assert got["defaults"] != got["set"]  # the arguments reach the prompt and the pixels


def test_video_files_go_through_corelens_reader(setup, tmp_path):
    """A video file (as lmms-eval's video tasks give them) is read by corelens' reader at fps, max_num_frames."""
    import av

    from corelens.data.sample import Sample, Video
    from corelens.integrations.lmms_eval.model import Corelens

    data = generate("video", tmp_path / "frames", 1, seed=3)
    (sample,), _ = read_samples(data)
    clip = tmp_path / "clip one.mp4"
    with av.open(str(clip), "w") as container:
        stream = container.add_stream("mpeg4", rate=2)
        stream.width, stream.height, stream.pix_fmt = *sample.frame_sizes[0], "yuv420p"
        for path in sample.video.frames:
            for packet in stream.encode(av.VideoFrame.from_image(Image.open(path).convert("RGB"))):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    model = Corelens(str(organism_path()), device="cpu", system_prompt="", min_pixels=3136, max_pixels=50176,
                     fps=2, max_num_frames=4, visual_prep="corelens")  # fmt: skip
    task_dict, requests = _requests(
        "video", [{"question": sample.question}], POPE_KWARGS, lambda doc: [str(clip)]
    )
    (got,) = _answers(model, task_dict, requests)
    expected = answer(model.m, Sample("x", "video", sample.question, video=Video(None, clip, 2.0, 4)))
    assert got == expected and got


def test_generation_settings_are_honoured_or_refused_by_name():
    from corelens.errors import OptionError
    from corelens.integrations.lmms_eval.model import greedy_tokens

    assert greedy_tokens(POPE_KWARGS, 5, "t") == (8, [])
    assert greedy_tokens({"until": ["\n\n", "Q:", ""], "do_sample": True}, 5, "t") == (5, ["Q:"])
    assert greedy_tokens({"until": "."}, 5, "t") == (5, ["."])
    for kwargs, name in (({"temperature": 0.7}, "temperature=0.7"), ({"num_beams": 4}, "num_beams=4"),
                         ({"top_k": 5, "repetition_penalty": 1.1}, "['repetition_penalty', 'top_k']")):  # fmt: skip
        with pytest.raises(OptionError, match=re.escape(name)):
            greedy_tokens(kwargs, 5, "task t")


def test_task_yaml_keeps_a_path_with_spaces_and_hash(setup):
    """lmms-eval's own YAML loader reads the data path back whole, and the `!function`s resolve."""
    from lmms_eval.utils import load_yaml_config

    yaml_path = setup["root"] / TASK_DIR / "organism_image.yaml"
    config = load_yaml_config(str(yaml_path))
    assert config["dataset_kwargs"]["data_files"]["test"] == str((setup["root"] / TASK_DIR).resolve() /
                                                                 "organism_image.json")  # fmt: skip
    assert " #" in config["dataset_kwargs"]["data_files"]["test"]
    assert config["doc_to_text"]({"question": "q?"}) == "q?"


def test_a_policy_the_integration_never_names_answers_from_its_json(tmp_path, monkeypatch):
    """`policy=FILE.json` takes any registered policy by its name: `uniform`, `knockout` with Omega (read from
    the sample's targets) and one registered in this test answer as `corelens.answer` under that policy; the
    deprecated wrapper (`from_args`, `read_policy`, `Policy`) warns and still answers the same."""
    from corelens.integrations.lmms_eval import policy as lmms_policy
    from corelens.models.prepare import prepare
    from corelens.policies import Policy

    toy = register_toy_policy(monkeypatch)  # zero ablation under a name no integration knows
    m = corelens.load(organism_path(), device="cpu")
    sample = read_samples(generate("image", tmp_path / "data", 1, seed=1))[0][0]
    p = prepare(m, sample)
    plain = corelens.answer(m, p, None, max_new_tokens=2)
    core = [[0, 5], [0, 6], [0, 7]]  # the organism's top heads: zeroing or knocking them out changes answers
    changed = 0
    for data in ({"name": "uniform"}, {"name": "knockout", "keys": "omega"}, {"name": toy}):
        policy = Policy.from_dict({**data, "heads": core})
        path = tmp_path / f"{policy.name}.json"
        path.write_text(policy.to_json())
        chosen = lmms_policy.policy_of(m, {"policy": str(path)})
        assert chosen == policy
        got = lmms_policy.answer_sample(m, sample, chosen, 2)
        assert got == corelens.answer(m, p, policy, sample=sample, max_new_tokens=2), policy.name
        changed += got != plain
    assert changed >= 2  # the policies act, so the equalities above can fail
    assert lmms_policy.policy_of(m, {}) is None  # no policy: the model as it is

    # The wrapper type these replace, and the functions returning it, warn and still work for one release.
    with pytest.warns(DeprecationWarning, match="lmms_eval.policy.from_args"):
        wrapped = lmms_policy.from_args(m, {"policy": str(path)})
    assert wrapped.policy == policy and wrapped.answer(m, sample, 2) == got
    with pytest.warns(DeprecationWarning, match="lmms_eval.policy.read_policy"):
        assert lmms_policy.read_policy(path).policy == policy
    with pytest.warns(DeprecationWarning, match="lmms_eval.policy.Policy"):
        assert lmms_policy.Policy().answer(m, sample, 2) == plain
