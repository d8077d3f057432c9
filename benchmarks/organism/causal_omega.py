"""Causal Omega against the organism's annotations (issue 21): regions, ranking agreement, ablation.

Per task: 16 seed-1 samples (the demo's rank seed) get Omega from their targets and from both estimators;
RAM is measured on each with the demo's query rows. Writes into OUT:
- causal-omega-regions.csv: per sample and estimator, |Omega| estimated / true, IoU, recall, precision;
- causal-omega-spearman.csv: Spearman of the 32 heads' mean RAM (estimated vs true Omega), 1000 bootstrap
  resamples of the samples (95 % percentile interval), top-3 overlap;
- causal-omega-ablate.csv: accuracy on 40 seed-3 samples with the top-1 / top-3 heads of each ranking zeroed.
Usage: python causal_omega.py OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

import corelens as cl
from corelens.capture.omega import OmegaSettings, estimate_omega
from corelens.data.sample import read_samples
from corelens.experiments.ablate import sweep
from corelens.experiments.demo import DEMO_QUERY
from corelens.experiments.rank import measure_sample
from corelens.models.prepare import prepare
from corelens.organism import organism_path
from corelens.organism.tasks import generate

N_RANK, N_EVAL, N_BOOT, K_OVERLAP = 16, 40, 1000, 3
SOURCES = ("targets", "occlusion", "gradient")


def main(out: Path) -> None:
    m = cl.load(organism_path(), device="cpu")
    regions, agreement, ablation = [], [], []
    for task in ("image", "video", "document"):
        samples, _ = read_samples(generate(task, out / "rank-data", N_RANK, seed=1))
        masses = {s: [] for s in SOURCES}
        for sample in samples:
            truth = prepare(m, sample).layout.omega(sample.targets)
            found = {"targets": truth}
            for est in SOURCES[1:]:
                omega, said = estimate_omega(m, sample, OmegaSettings(est))
                found[est] = omega
                inter = len(np.intersect1d(omega, truth))
                regions.append(
                    {
                        "task": task,
                        "id": sample.id,
                        "estimator": est,
                        "n_est": len(omega),
                        "n_true": len(truth),
                        "iou": inter / len(np.union1d(omega, truth)),
                        "recall": inter / len(truth),
                        "precision": inter / len(omega) if len(omega) else np.nan,
                        "own_answer_correct": said == sample.answer,
                    }
                )
            if all(len(found[s]) for s in SOURCES):  # an empty estimate has no RAM: dropped from the rankings
                for s in SOURCES:
                    ram = measure_sample(m, sample, DEMO_QUERY[task], omega=found[s])
                    masses[s].append(ram.mass.ravel())
        means = {s: np.mean(masses[s], axis=0) for s in SOURCES}
        rng = np.random.default_rng(0)
        n = len(masses["targets"])
        for est in SOURCES[1:]:
            boot = []
            for _ in range(N_BOOT):
                pick = rng.integers(0, n, n)
                a, b = np.asarray(masses["targets"])[pick].mean(0), np.asarray(masses[est])[pick].mean(0)
                boot.append(spearmanr(a, b).statistic)
            top_true = set(np.argsort(-means["targets"], kind="stable")[:K_OVERLAP])
            top_est = set(np.argsort(-means[est], kind="stable")[:K_OVERLAP])
            agreement.append(
                {
                    "task": task,
                    "estimator": est,
                    "samples": n,
                    "spearman": spearmanr(means["targets"], means[est]).statistic,
                    "ci_low": np.nanpercentile(boot, 2.5),
                    "ci_high": np.nanpercentile(boot, 97.5),
                    f"top{K_OVERLAP}_overlap": len(top_true & top_est),
                }
            )
        eval_data = generate(task, out / "eval-data", N_EVAL, seed=3)
        for s in SOURCES:
            heads = out / f"heads-{task}-{s}.csv"
            table = pd.DataFrame(
                {
                    "layer": np.repeat(np.arange(m.num_layers), m.num_heads),
                    "head": np.tile(np.arange(m.num_heads), m.num_layers),
                }
            )
            table["mass"] = means[s]
            table["rank"] = table["mass"].rank(ascending=False, method="first").astype(int)
            table.to_csv(heads, index=False)
            result = sweep(m, eval_data, heads, ks=("1", "3"), sets=("top",), seeds=1, warn=lambda _: None)
            for row in result.summary.itertuples():
                ablation.append(
                    {
                        "task": task,
                        "omega": s,
                        "set": row.set,
                        "k": row.k,
                        "heads": " ".join(
                            f"L{i // m.num_heads}H{i % m.num_heads}"
                            for i in np.argsort(-means[s], kind="stable")[: int(row.k_heads)]
                        ),
                        "accuracy": row.accuracy,
                        "ci_low": row.ci_low,
                        "ci_high": row.ci_high,
                    }
                )
    pd.DataFrame(regions).to_csv(out / "causal-omega-regions.csv", index=False)
    pd.DataFrame(agreement).to_csv(out / "causal-omega-spearman.csv", index=False)
    pd.DataFrame(ablation).to_csv(out / "causal-omega-ablate.csv", index=False)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
