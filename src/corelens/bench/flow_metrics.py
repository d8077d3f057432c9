"""RID + MixIG benchmark: corelens' Gram / blocked route against the metrics computed directly.

One module's input and output states (S x H, captured fp32) are synthesised: X has a decaying spectrum,
a few sink rows of large norm and a per-row scale, and X' = X + ΔX with ΔX mostly inside X's row space
plus a small new component, like an attention update. Both sides compute, in float64, the same numbers:
RID, ΔS, ΔD, eRank(X), eRank(X'), TME(X), TME(X'), MixIG.

- ``direct``: `numpy.linalg.svd` of X (singular values and vectors) and of X' (values), projections through
  the singular vectors, and TME from the dense S x S cosine matrix (`direct_metrics`, also the reference
  of the tests);
- ``corelens``: `rid_terms` + `tme` (Gram of the small side, eigenvalues, n x n products, blocked TME).

Both run in the same process, alternately, `repeats` times; the median wall and process-CPU times, their
ratios and the largest relative difference of any metric are written. `--threads N` sets every BLAS pool
(OpenBLAS, OpenMP, MKL) to N threads. Run as
``corelens bench flow --tokens 4096 --hidden 3584 --threads 1 --json FILE``
(or ``corelens bench flow ...``).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time

import numpy as np
import torch

from corelens.bench.synthetic import cores
from corelens.metrics.mixing import tme
from corelens.metrics.spectra import FP32_EPS, kept_rank, rid_terms

_THREADS_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
METRICS = ("rid", "dS", "dD", "erank_in", "erank_out", "tme_in", "tme_out", "mixig")


def _erank(sigma: np.ndarray) -> float:
    total = sigma.sum()
    if total <= 0:
        return 0.0
    p = sigma / total
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def direct_tme(x: np.ndarray, *, rows: str = "mean", alpha: float = 1.0) -> float:
    """Return TME from the dense S x S cosine matrix (the definition, float64)."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    n = x / np.where(norms > 0, norms, 1.0)
    w = ((np.clip(n @ n.T, -1.0, 1.0) + 1.0) / 2.0) ** alpha
    p = w / w.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(p > 0, p * np.log(p), 0.0)
    ent = -plogp.sum(axis=1)
    value = ent[-1] if rows == "last" else ent.mean()
    return float(value / math.log(x.shape[0]))


def direct_metrics(
    x: np.ndarray,
    x_new: np.ndarray,
    *,
    rank: str = "numerical",
    eps: float = FP32_EPS,
    energy: float = 0.99,
    rows: str = "mean",
    alpha: float = 1.0,
    full: bool = True,
) -> dict[str, float]:
    """Return RID, ΔS, ΔD (+ both terms), eRanks, TMEs and MixIG by SVD and dense similarity (float64).

    `full`: numpy's default complete SVD of X (U is S x S); False takes the reduced one (U is S x min(S, H)).
    """
    x = np.asarray(x, dtype=np.float64)
    x_new = np.asarray(x_new, dtype=np.float64)
    s, h = x.shape
    u, sigma, vt = np.linalg.svd(x, full_matrices=full)
    sigma_new = np.linalg.svd(x_new, compute_uv=False)
    r = kept_rank(torch.from_numpy(sigma), (s, h), rule=rank, eps=eps, energy=energy)
    u_r, v_r = u[:, :r], vt[:r].T
    outside_cols = x_new - u_r @ (u_r.T @ x_new)
    outside_rows = x_new - (x_new @ v_r) @ v_r.T
    norm = np.linalg.norm(x_new)
    d_token = np.linalg.norm(outside_cols) / (2 * norm) if norm > 0 else 0.0
    d_hidden = np.linalg.norm(outside_rows) / (2 * norm) if norm > 0 else 0.0
    e_in, e_out = _erank(sigma), _erank(sigma_new)
    d_s = abs(e_out - e_in) / min(s, h)
    t_in, t_out = direct_tme(x, rows=rows, alpha=alpha), direct_tme(x_new, rows=rows, alpha=alpha)
    return {
        "rid": d_s + d_token + d_hidden,
        "dS": d_s,
        "dD": d_token + d_hidden,
        "dD_token": float(d_token),
        "dD_hidden": float(d_hidden),
        "erank_in": e_in,
        "erank_out": e_out,
        "rank": r,
        "tme_in": t_in,
        "tme_out": t_out,
        "mixig": t_out - t_in,
    }


def corelens_metrics(x: np.ndarray, x_new: np.ndarray, **options) -> dict[str, float]:
    """Return the same metrics through corelens (`rid_terms` + blocked `tme`)."""
    terms = rid_terms(x, x_new)
    t_in, t_out = tme(x), tme(x_new)
    return {
        "rid": terms.rid,
        "dS": terms.dS,
        "dD": terms.dD,
        "dD_token": terms.dD_token,
        "dD_hidden": terms.dD_hidden,
        "erank_in": terms.erank_in,
        "erank_out": terms.erank_out,
        "rank": terms.rank,
        "tme_in": t_in,
        "tme_out": t_out,
        "mixig": t_out - t_in,
    }


def make_states(tokens: int, hidden: int, *, seed: int = 0, sinks: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Return (X, X') as float32: a decaying spectrum, sink rows, per-row scales; X' = X + structured ΔX."""
    rng = np.random.default_rng(seed)
    k = min(tokens, hidden)
    scale = np.exp(-np.arange(k) / (k / 6.0)) + 0.02
    a = rng.standard_normal((tokens, k)) * scale
    x = a @ np.linalg.qr(rng.standard_normal((hidden, k)))[0].T
    x *= rng.uniform(0.5, 2.0, (tokens, 1))
    x[:sinks] *= 50.0  # attention-sink tokens: far larger norm than the rest
    mix = rng.standard_normal((tokens, tokens)) / np.sqrt(tokens)
    delta = 0.3 * (mix @ x) / np.sqrt(tokens) + 0.05 * rng.standard_normal((tokens, hidden)) * x.std()
    return x.astype(np.float32), (x + delta).astype(np.float32)


def run_flow_benchmark(
    tokens: int, hidden: int, *, repeats: int = 1, seed: int = 0, device: str = "cpu"
) -> dict:
    """Time both sides on the same states `repeats` times, alternately; return times, ratio and accuracy.

    With a CUDA `device`, corelens' side computes on the GPU from states already there (as `corelens flow
    --device cuda` captures them); the direct side stays numpy on the CPU.
    """
    x, x_new = make_states(tokens, hidden, seed=seed)
    on_gpu = torch.device(device).type == "cuda"
    states = {
        "direct": (x, x_new),
        "corelens": (torch.from_numpy(x).to(device), torch.from_numpy(x_new).to(device))
        if on_gpu
        else (x, x_new),
    }
    times: dict[str, list[float]] = {"direct": [], "corelens": []}
    cpu: dict[str, list[float]] = {
        "direct": [],
        "corelens": [],
    }  # process CPU time: steadier on a shared machine
    load_before = os.getloadavg()
    results: dict[str, dict] = {}
    for _ in range(repeats):
        for side, fn in (("direct", direct_metrics), ("corelens", corelens_metrics)):
            t0, c0 = time.perf_counter(), time.process_time()
            results[side] = fn(*states[side])
            if on_gpu:
                torch.cuda.synchronize(device)
            times[side].append(time.perf_counter() - t0)
            cpu[side].append(time.process_time() - c0)
    direct_s = statistics.median(times["direct"])
    corelens_s = statistics.median(times["corelens"])
    rel = {
        k: abs(results["corelens"][k] - results["direct"][k]) / max(abs(results["direct"][k]), 1e-300)
        for k in METRICS
    }
    return {
        "benchmark": "flow",
        "tokens": tokens,
        "hidden": hidden,
        "repeats": repeats,
        "seed": seed,
        "device": device,
        "direct_s": round(direct_s, 3),
        "corelens_s": round(corelens_s, 3),
        "speedup": round(direct_s / corelens_s, 2),
        "times": {k: [round(t, 3) for t in v] for k, v in times.items()},
        "cpu_s": {k: [round(t, 3) for t in v] for k, v in cpu.items()},
        "cpu_speedup": round(statistics.median(cpu["direct"]) / statistics.median(cpu["corelens"]), 2),
        "max_rel_diff": max(rel.values()),
        "rel_diff": rel,
        "direct": results["direct"],
        "corelens": results["corelens"],
        "machine": {
            "cores": cores(),
            "torch_threads": torch.get_num_threads(),
            "thread_env": {k: os.environ.get(k) for k in _THREADS_ENV},
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "numpy": np.__version__,
        },
    }


def summary(result: dict) -> str:
    """Return the one-line summary of a result: both times, the speed-ups and the largest difference."""
    return (
        f"S={result['tokens']} H={result['hidden']}: direct {result['direct_s']:.2f} s, corelens "
        f"{result['corelens_s']:.2f} s, speed-up {result['speedup']:.1f}x (CPU time {result['cpu_speedup']:.1f}x), "
        f"max relative difference {result['max_rel_diff']:.2e}"
    )
