"""lmms-eval with the corelens model: docs/integrations.md's command on a local task, offline, on the organism.

Unmodified, the model answers as corelens' own harness; under a policy it answers as `corelens ablate`,
`corelens hybrid` and `corelens sap` do under the same policy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

import corelens
from corelens.cli import main
from corelens.data import read_samples
from corelens.experiments.evaluate import answer
from corelens.organism import organism_path
from corelens.organism.tasks import generate

pytest.importorskip("lmms_eval", reason="the lmms extra is not installed")
from corelens.integrations.lmms_eval.__main__ import main as write_task_main  # noqa: E402

N = 6


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
    assert write_task_main([str(data), "--out", str(root / "task"), "--task", "organism_image"]) == 0
    samples, _ = read_samples(data)
    m = corelens.load(organism_path(), device="cpu")
    harness = [answer(m, s, max_new_tokens=8) for s in samples]
    return {"root": root, "data": data, "heads": run / "heads.csv", "samples": samples, "harness": harness}


def _model_args(model_args: str) -> str:
    return f"pretrained={organism_path()},device=cpu" + (f",{model_args}" if model_args else "")


def _read(out) -> tuple[list[str], float]:
    """Return the answers by document and the accuracy that lmms-eval logged under `out`."""
    logged = sorted(out.glob("*/*_samples_organism_image.jsonl"))
    assert logged, f"lmms-eval wrote no samples under {out}"  # it exits 0 after logging an error
    rows = [json.loads(line) for line in logged[-1].read_text().splitlines()]
    results = json.loads(sorted(out.glob("*/*_results.json"))[-1].read_text())
    answers = [r["filtered_resps"] for r in sorted(rows, key=lambda r: r["doc_id"])]
    answers = [a[0] if isinstance(a, list) else a for a in answers]
    return answers, results["results"]["organism_image"]["accuracy,none"]


def _run(args: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "lmms_eval", *args], capture_output=True, text=True, env=ENV,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]


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
    path.write_text(json.dumps(next(p for p in policy if p["name"].startswith("top"))))
    model_args = {
        "ablate": f"heads={heads},k=8,op=zero",
        "hybrid-file": f"policy={path}",
        "hybrid-args": f"full={heads},keep=2,sink=1,window=2",
        "sap": "prior=noise,layers=0-3",
    }
    config = [
        {"model": "corelens", "model_args": _model_args(args), "tasks": "organism_image",
         "include_path": str(root / "task"), "output_path": str(root / f"lmms-{tag}"), "log_samples": True}
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
          str(setup["root"] / "task"), "--output_path", str(out), "--log_samples"])  # fmt: skip
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
