"""Data-parallel scaling and per-sample overhead of `corelens rank` (both sides timed in one run).

1. Scaling: the same ranking of N organism-task samples (at each of several run sizes N) on a random-weight
   Qwen2.5-VL decoder of realistic width, run as one process and as `torchrun --standalone --nproc-per-node 2`,
   one thread per process, repeats interleaved; wall time of each whole command (start-up, model load and the
   merge included) and of the sample loop alone (the slowest rank), and their difference, the command's fixed
   cost. The two runs' heads.csv must be byte-identical.
2. Overhead: per sample, `corelens rank`'s step (prepare through the checkpoint's processor, layout, probed
   forward, record, fsynced log line) against the stock path on the same samples: the processor's chat
   template and call, then a plain sdpa forward of the stock transformers model, in one process.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

SCALE_TARGET = 0.6  # 2 ranks finish in at most this share of 1 rank's time
OVERHEAD_TARGET = 1.15  # corelens rank per sample vs processor + sdpa forward


def build(root: Path, *, sizes: list[int], task: str, layers: int, hidden: int, heads: int, kv_heads: int,
          head_dim: int, intermediate: int, seed: int) -> tuple[Path, dict[int, Path]]:  # fmt: skip
    """Write the random-weight checkpoint and one sample file per size; return their paths."""
    from corelens.models.tiny import build_tiny_checkpoint
    from corelens.organism.tasks import WORDS, generate

    model = build_tiny_checkpoint(
        "qwen2_5_vl", root / "model", words=WORDS, seed=seed, layers=layers, hidden=hidden, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, intermediate=intermediate,
    )  # fmt: skip
    return model, {n: generate(task, root / f"data-{n}", n, seed=seed + 1) for n in sizes}


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def time_rank(model: Path, data: Path, out: Path, nproc: int) -> dict:
    """Run `corelens rank` with `nproc` processes (1: no torchrun); return wall and loop seconds."""
    args = ["-m", "corelens", "rank", "--model", str(model), "--data", str(data), "--out", str(out),
            "--overlays", "0", "--device", "cpu"]  # fmt: skip
    if nproc > 1:
        args = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], env=_env(), capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"corelens rank with {nproc} process(es) failed:\n{done.stderr[-3000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    return {
        "wall_s": wall,
        "loop_s": max(p["seconds"] for p in manifest["processes"]),
        "samples_per_rank": [p["samples"] for p in manifest["processes"]],
    }


def _stock_forward(model, processor, sample) -> None:
    from corelens.data.sample import load_images
    from corelens.models.prepare import messages

    text = processor.apply_chat_template(messages(sample), add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=load_images(sample) or None, return_tensors="pt")
    with torch.no_grad():
        model(**inputs, use_cache=False, logits_to_keep=1)


def overhead(model_dir: Path, data: Path, root: Path, repeats: int) -> dict:
    """Return per-sample seconds of the stock path and of `corelens rank`'s step, interleaved by repeat."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from corelens.data import read_samples
    from corelens.experiments.rank import measure_sample, rank
    from corelens.models import load

    torch.set_num_threads(1)
    samples, _ = read_samples(data)
    stock = AutoModelForImageTextToText.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    m = load(model_dir, device="cpu", dtype="float32")
    _stock_forward(stock, processor, samples[0])  # warm-up of both paths
    measure_sample(m, samples[0])
    plain, ours = [], []
    for r in range(repeats):
        start = time.perf_counter()
        for sample in samples:
            _stock_forward(stock, processor, sample)
        plain.append((time.perf_counter() - start) / len(samples))
        out = root / f"overhead-{r}"
        rank(m, data, out=out)
        manifest = json.loads((out / "manifest.json").read_text())
        ours.append(manifest["processes"][0]["seconds"] / len(samples))
    ratios = [o / p for o, p in zip(ours, plain)]
    return {"stock_s": plain, "corelens_s": ours, "ratio": statistics.median(ratios), "ratios": ratios}


def scaling(model: Path, data: Path, root: Path, repeats: int) -> dict:
    """Time 1 and 2 ranks on one sample file, repeats interleaved; check their heads.csv are identical."""
    runs: dict[int, list[dict]] = {1: [], 2: []}
    for r in range(repeats):
        for nproc in (1, 2):
            runs[nproc].append(time_rank(model, data, root / f"rank-{nproc}-{r}", nproc))
        if (root / f"rank-1-{r}" / "heads.csv").read_bytes() != (
            root / f"rank-2-{r}" / "heads.csv"
        ).read_bytes():
            raise RuntimeError(f"heads.csv of 1 and 2 ranks differ ({data})")
    wall = [b["wall_s"] / a["wall_s"] for a, b in zip(runs[1], runs[2])]
    loop = [b["loop_s"] / a["loop_s"] for a, b in zip(runs[1], runs[2])]
    return {
        "one_rank": runs[1],
        "two_ranks": runs[2],
        "wall_ratio": statistics.median(wall),
        "loop_ratio": statistics.median(loop),
        "wall_ratios": wall,
        # what a command costs besides its sample loop: imports, model load, lengths, merge, tables, figures
        "fixed_s": {str(n): statistics.median(x["wall_s"] - x["loop_s"] for x in runs[n]) for n in (1, 2)},
        "heads_identical": True,
    }


def run_scale_benchmark(*, sizes: tuple[int, ...] = (32, 256), task: str = "document", repeats: int = 2,
                        layers: int = 4, hidden: int = 2048, heads: int = 16, kv_heads: int = 2,
                        head_dim: int = 128, intermediate: int = 5632, seed: int = 0,
                        with_overhead: bool = True) -> dict:  # fmt: skip
    """Return the scaling measurements at each run size and the overhead (see the module docstring).

    The target applies at the largest size: the fixed cost of a command (a few seconds of imports and
    model load in every process) is the same at any size, and a real ranking has thousands of samples.
    """
    from corelens.bench.synthetic import machine_info

    sizes = tuple(sorted(set(sizes)))
    with tempfile.TemporaryDirectory(prefix="corelens-scale-") as tmp:
        root = Path(tmp)
        shape = dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                     intermediate=intermediate)  # fmt: skip
        model, data = build(root, sizes=list(sizes), task=task, seed=seed, **shape)
        per_size = [{"samples": n, **scaling(model, data[n], root / f"n{n}", repeats)} for n in sizes]
        result = {
            "sizes": per_size,
            "task": task,
            "model": {"family": "qwen2_5_vl", "random_weights": True, **shape},
            "repeats": repeats,
            "wall_ratio": per_size[-1]["wall_ratio"],
            "scale_target": SCALE_TARGET,
            "scale_target_met": per_size[-1]["wall_ratio"] <= SCALE_TARGET,
            "machine": machine_info(),
            "torch_threads_per_process": 1,
        }
        if with_overhead:
            result["overhead"] = {**overhead(model, data[sizes[0]], root, repeats), "target": OVERHEAD_TARGET}
    return result


def summary(result: dict) -> str:
    """Return the README lines of a result."""
    model = result["model"]
    lines = [f"{result['task']} samples, {model['layers']} layers x hidden {model['hidden']}, wall medians of "
             f"{result['repeats']} (target <= {SCALE_TARGET} at the largest size):"]  # fmt: skip
    for size in result["sizes"]:
        one, two = (statistics.median(r["wall_s"] for r in size[k]) for k in ("one_rank", "two_ranks"))
        lines.append(
            f"  {size['samples']:>5} samples: 1 rank {one:.1f} s, 2 ranks {two:.1f} s: {size['wall_ratio']:.2f}x; "
            f"sample loop alone {size['loop_ratio']:.2f}x; fixed cost {size['fixed_s']['1']:.1f} s / "
            f"{size['fixed_s']['2']:.1f} s; heads.csv identical"
        )
    if "overhead" in result:
        o = result["overhead"]
        lines.append(
            f"per sample: stock processor + sdpa forward {statistics.median(o['stock_s']):.3f} s, corelens rank "
            f"{statistics.median(o['corelens_s']):.3f} s: {o['ratio']:.3f}x (target <= {OVERHEAD_TARGET})"
        )
    return "\n".join(lines)
