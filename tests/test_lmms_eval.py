"""lmms-eval with the corelens model: the README command on a local task, offline, on the organism checkpoint.

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


def _lmms(setup, tag, model_args=""):
    """Run the README's lmms-eval command; return the answers by document and the accuracy."""
    out = setup["root"] / f"lmms-{tag}"
    args = f"pretrained={organism_path()},device=cpu" + (f",{model_args}" if model_args else "")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "lmms_eval", "--model", "corelens", "--model_args", args, "--tasks",
           "organism_image", "--include_path", str(setup["root"] / "task"), "--output_path", str(out),
           "--log_samples"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    logged = sorted(out.glob("*/*_samples_organism_image.jsonl"))
    # lmms-eval exits 0 after logging an error: the samples file is the proof that it ran.
    assert proc.returncode == 0 and logged, proc.stderr[-3000:]
    rows = [json.loads(line) for line in logged[-1].read_text().splitlines()]
    results = json.loads(sorted(out.glob("*/*_results.json"))[-1].read_text())
    answers = [r["filtered_resps"] for r in sorted(rows, key=lambda r: r["doc_id"])]
    answers = [a[0] if isinstance(a, list) else a for a in answers]
    return answers, results["results"]["organism_image"]["accuracy,none"]


def test_unmodified_model_answers_as_the_harness(setup):
    answers, accuracy = _lmms(setup, "plain")
    assert answers == setup["harness"]
    gold = [s.answer for s in setup["samples"]]
    assert accuracy == pytest.approx(sum(a == g for a, g in zip(answers, gold)) / N)


def test_ablation_answers_as_corelens_ablate(setup):
    out = setup["root"] / "ablate"
    assert main(["ablate", "--model", str(organism_path()), "--data", str(setup["data"]), "--heads",
                 str(setup["heads"]), "--out", str(out), "--k", "8", "--sets", "top", "--op", "zero"]) == 0  # fmt: skip
    records = pd.read_parquet(out / "records.parquet")
    ours = records[records["condition"] == "top/8"].set_index("sample")["prediction"]
    expected = [ours[s.id] for s in setup["samples"]]
    answers, _ = _lmms(setup, "ablate", f"heads={setup['heads']},k=8,op=zero")
    assert answers == expected
    assert answers != setup["harness"]  # the policy changes answers


def test_hybrid_answers_as_corelens_hybrid(setup):
    out = setup["root"] / "hybrid"
    assert main(["hybrid", "--model", str(organism_path()), "--data", str(setup["data"]), "--heads",
                 str(setup["heads"]), "--out", str(out), "--keep", "2", "--sets", "top", "--sink", "1",
                 "--window", "2"]) == 0  # fmt: skip
    records = pd.read_parquet(out / "records.parquet")
    ours = records[records["condition"].str.startswith("top")].set_index("sample")["prediction"]
    expected = [ours[s.id] for s in setup["samples"]]
    policy = json.loads((out / "policies.json").read_text())
    path = setup["root"] / "hybrid-policy.json"
    path.write_text(json.dumps(next(p for p in policy if p["name"].startswith("top"))))
    answers, _ = _lmms(setup, "hybrid-file", f"policy={path}")
    assert answers == expected
    assert answers != setup["harness"]
    inline, _ = _lmms(setup, "hybrid-args", f"full={setup['heads']},keep=2,sink=1,window=2")
    assert inline == expected


def test_sap_answers_as_corelens_sap(setup):
    out = setup["root"] / "sap"
    assert main(["sap", "--model", str(organism_path()), "--data", str(setup["data"]), "--out", str(out),
                 "--prior", "noise", "--layers", "0-3"]) == 0  # fmt: skip
    frame = pd.read_parquet(out / "sap.parquet")
    ours = frame[frame["condition"] == "noise@0-3"].set_index("sample_id")["prediction"]
    expected = [ours[s.id] for s in setup["samples"]]
    answers, _ = _lmms(setup, "sap", "prior=noise,layers=0-3")
    assert answers == expected
    assert answers != setup["harness"]


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
