"""Data-parallel runs under torchrun (CPU, gloo): outputs identical to one process, resume after a dead rank.

Each launch is a real `torchrun --standalone --nproc-per-node 2 -m corelens ...` of two processes. Both sides run
with one thread per process, so that the floating-point reductions are the same on both sides.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
import torch

from corelens.cli import main
from corelens.organism.tasks import WORDS, generate

pytestmark = pytest.mark.e2e  # whole workflows: `make check` leaves this file out

TABLES = {
    "rank": ["heads.csv", "ram.parquet"],
    "ablate": ["ablation.csv", "ablation_summary.csv", "records.parquet"],
    "hybrid": ["hybrid.csv", "records.parquet"],
    "flow": ["table1.csv", "layers.csv", "flow.parquet"],
    "sap": ["accuracy.csv", "key_region.csv", "sap.parquet"],
}


@contextmanager
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from corelens.models.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("dist")
    model = build_tiny_checkpoint("qwen2_5_vl", root / "model", words=WORDS, layers=2, heads=4, kv_heads=2)
    data = generate("image", root / "data", 8, seed=3)
    heads = root / "ranked"
    with one_thread():
        assert main(["rank", "--model", str(model), "--data", str(generate("image", root / "id", 4, seed=1)),
                     "--out", str(heads), "--overlays", "0"]) == 0  # fmt: skip
    return {"model": model, "data": data, "heads": heads / "heads.csv", "root": root}


def argv(setup: dict, command: str, out: Path, data: Path | None = None) -> list[str]:
    """Return the corelens arguments of `command` on the shared tiny setup."""
    base = [command, "--model", str(setup["model"]), "--data", str(data or setup["data"]), "--out", str(out)]
    extra = {
        "rank": ["--overlays", "0"],
        "ablate": ["--heads", str(setup["heads"]), "--k", "1,3", "--seeds", "2", "--max-new-tokens", "3"],
        "hybrid": [
            "--heads",
            str(setup["heads"]),
            "--keep",
            "2,4",
            "--sink",
            "2",
            "--window",
            "8",
            "--seeds",
            "2",
            "--max-new-tokens",
            "3",
        ],  # fmt: skip
        "flow": ["--limit", "4"],
        "sap": ["--limit", "4", "--max-new-tokens", "3", "--prior", "noise,key"],
    }[command]
    return base + extra


def torchrun(args: list[str], nproc: int = 2, **popen) -> subprocess.Popen:
    """Start `torchrun --standalone --nproc-per-node N -m corelens ARGS` (one thread per rank)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "corelens", *args]  # fmt: skip
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out + err


def assert_same_tables(command: str, a: Path, b: Path) -> None:
    for name in TABLES[command]:
        if name.endswith(".csv"):
            assert (a / name).read_bytes() == (b / name).read_bytes(), f"{command}: {name} differs"
        else:
            pd.testing.assert_frame_equal(
                pd.read_parquet(a / name), pd.read_parquet(b / name), check_exact=True
            )


def single_run(setup: dict, command: str) -> Path:
    """Return the one-process run of `command` on the shared setup (run once per worker, then only read)."""
    single = setup["root"] / f"single-{command}"
    if single not in setup.setdefault("single", set()):
        with one_thread():
            assert main(argv(setup, command, single)) == 0
        setup["single"].add(single)
    return single


@pytest.mark.parametrize("command", list(TABLES))
def test_two_ranks_equal_one_process(setup, tmp_path, command):
    single = single_run(setup, command)
    code, log = finish(torchrun(argv(setup, command, tmp_path / "dist")))
    assert code == 0, log
    assert_same_tables(command, single, tmp_path / "dist")
    manifest = json.loads((tmp_path / "dist" / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and [p["rank"] for p in manifest["processes"]] == [0, 1]
    # Both ranks worked (shares balanced by prompt length), and rank 0 merged their shards into one log.
    assert all(p["samples"] > 0 for p in manifest["processes"])
    assert not list((tmp_path / "dist").glob("samples.rank*.jsonl"))
    single_ids = sorted(
        json.loads(line)["id"] for line in (single / "samples.jsonl").read_text().splitlines()
    )
    dist_log = (tmp_path / "dist" / "samples.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["id"] for line in dist_log) == single_ids


def _rank_pids(parent: int) -> dict[int, int]:
    """Return {RANK: pid} of the worker processes a torchrun agent started."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent:
            for item in env:
                if item.startswith(b"RANK="):
                    found[int(item[5:])] = int(entry.name)
    return found


def _kill_rank_midway(setup: dict, out: Path, after: int, rank: int = 1) -> list[str]:
    """Start a 2-rank ablation, SIGKILL `rank` once it has logged `after` records; return the logged ids."""
    proc = torchrun(argv(setup, "ablate", out))
    shard = out / f"samples.rank{rank}.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if shard.is_file() and len(shard.read_text().splitlines()) >= after:
            os.kill(_rank_pids(proc.pid)[rank], signal.SIGKILL)
            break
        time.sleep(0.05)
    code, log = finish(proc)
    assert code != 0, f"the run finished before the kill:\n{log}"
    return [json.loads(line)["id"] for p in out.glob("samples*.jsonl") for line in p.read_text().splitlines()]


@pytest.mark.parametrize("restart_ranks", [1, 2])
def test_killed_rank_resumes_with_any_rank_count(setup, tmp_path, restart_ranks):
    single = single_run(
        setup, "ablate"
    )  # the same one-process run as test_two_ranks_equal_one_process[ablate]
    ids = [json.loads(line)["id"] for line in (single / "samples.jsonl").read_text().splitlines()]
    total, per_sample = len(ids), len(ids) // 8
    out = tmp_path / "dist"
    # Kill rank 1 once it has finished one sample and started the next.
    logged = _kill_rank_midway(setup, out, after=per_sample + 1)
    assert per_sample < len(logged) < total  # killed mid-way: some records kept, some left to do
    by_sample = Counter(i.split("|")[1] for i in logged)
    finished = {sample for sample, n in by_sample.items() if n == per_sample}
    if restart_ranks == 1:
        with one_thread():
            assert main(argv(setup, "ablate", out)) == 0
    else:
        code, log = finish(torchrun(argv(setup, "ablate", out)))
        assert code == 0, log
    assert_same_tables("ablate", single, out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["resumed"] == 1 and manifest["world_size"] == restart_ranks
    # Only unfinished work ran again: the restart took exactly the samples not finished before the kill.
    assert sum(p["samples"] for p in manifest["processes"]) == 8 - len(finished) < 8
    lines = (out / "samples.jsonl").read_text().splitlines()
    assert len(lines) == total == len({json.loads(line)["id"] for line in lines})


def _with_bad_sample(setup: dict, root: Path) -> tuple[Path, str]:
    """Return a copy of the data in which one sample has no answer (fatal for `rank --query answer`)."""
    lines = Path(setup["data"]).read_text().splitlines()
    bad = json.loads(lines[5])
    del bad["answer"]
    lines[5] = json.dumps(bad)
    path = Path(setup["data"]).parent / "with-bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, bad["id"]


def test_bad_input_names_rank_and_sample(setup, tmp_path):
    data, bad = _with_bad_sample(setup, tmp_path)
    code, log = finish(torchrun([*argv(setup, "rank", tmp_path / "run", data), "--query", "answer"]))
    assert code != 0
    lines = log.replace("\r", "\n").splitlines()
    errors = [x for x in lines if x.startswith("corelens: error:")]
    assert any(f"of 2] {data}:6, sample {bad!r}" in x and "needs an answer" in x for x in errors), log
    # The rank that waited for it says why it stops, without a traceback of its own (torchrun's agent
    # still prints its ChildFailedError report).
    assert any("another rank stopped" in x for x in errors) or len(errors) == 1, log
    assert not [x for x in lines if x.startswith("[rank") and "Traceback" in x], log


def test_skip_bad_across_ranks(setup, tmp_path):
    data, bad = _with_bad_sample(setup, tmp_path)
    single = tmp_path / "single"
    with one_thread():
        assert main([*argv(setup, "rank", single, data), "--query", "answer", "--skip-bad"]) == 0
    code, log = finish(
        torchrun([*argv(setup, "rank", tmp_path / "dist", data), "--query", "answer", "--skip-bad"])
    )
    assert code == 0, log
    assert_same_tables("rank", single, tmp_path / "dist")
    records = [json.loads(x) for x in (tmp_path / "dist" / "samples.jsonl").read_text().splitlines()]
    skipped = [r for r in records if r["status"] == "skipped"]
    assert [r["id"] for r in skipped] == [bad] and skipped[0]["rank"] in (0, 1)
    assert json.loads((tmp_path / "dist" / "manifest.json").read_text())["skipped"] == 1


@pytest.mark.parametrize(
    ("score", "table", "column"), [("gates", "gates.csv", "alpha"), ("greedy", "greedy.csv", "value")]
)
def test_gates_and_greedy_under_two_ranks_equal_one_process(setup, tmp_path, score, table, column):
    """The scorers optimised over all samples split each step's samples over the ranks and sum over them: the
    same gates (up to float32 rounding of the summed gradient) and the same greedy order as one process."""
    args = ["--overlays", "0", "--query", "answer", "--score", score, "--sink", "2", "--window", "3",
            "--gate-epochs", "1", "--gate-batch", "4", "--greedy-budget", "2"]  # fmt: skip
    base = ["rank", "--model", str(setup["model"]), "--data", str(setup["data"])]
    with one_thread():
        assert main([*base, "--out", str(tmp_path / "one"), *args]) == 0
    code, log = finish(torchrun([*base, "--out", str(tmp_path / "two"), *args]))
    assert code == 0, log
    one, two = (pd.read_csv(tmp_path / d / table) for d in ("one", "two"))
    keys = ["rank", "layer", "head"] if score == "greedy" else ["layer", "head"]
    if score == "gates":  # near-equal gates may swap places in gates.csv's order: compare head by head
        one, two = (t.sort_values(keys, ignore_index=True) for t in (one, two))
    pd.testing.assert_frame_equal(one[keys], two[keys])  # the same heads (greedy: in the same order)
    assert two[column].to_numpy() == pytest.approx(one[column].to_numpy(), rel=1e-5, abs=1e-6)
    assert one[column].nunique() > 1  # the optimisation moved: not all values equal
