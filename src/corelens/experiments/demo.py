"""The demo: synthetic samples of three tasks, `rank` on each, the top heads and where the runs are.

Until the trained model organism ships, the default model is a tiny RANDOMLY INITIALISED Qwen2.5-VL
checkpoint generated on the spot: the pipeline is real, the head ranking carries no meaning.
"""

from __future__ import annotations

from pathlib import Path

from corelens.experiments.rank import rank
from corelens.models.loaded import load
from corelens.models.tiny import build_tiny_checkpoint
from corelens.organism.tasks import TASKS, WORDS, generate

DEMO_LABEL = "tiny randomly initialised Qwen2.5-VL (no trained weights: rankings are meaningless)"


def default_model(folder: Path) -> Path:
    """Return the demo model folder, generating the tiny random checkpoint there if absent."""
    if not (folder / "config.json").exists():
        build_tiny_checkpoint(
            "qwen2_5_vl", folder, words=WORDS, layers=4, heads=8, kv_heads=2, hidden=128, head_dim=16
        )
    return folder


def run_demo(
    out: str | Path, *, model: str | Path | None = None, n: int = 8, top: int = 5
) -> dict[str, Path]:
    """Run the demo into `out`; return the run directory of each task."""
    out = Path(out)
    model_dir = Path(model) if model else default_model(out / "model")
    label = DEMO_LABEL if model is None else str(model_dir)
    print(f"model: {label}\n  at {model_dir}")
    m = load(model_dir)
    runs = {}
    for task in TASKS:
        data = generate(task, out / "data" / task, n, seed=1)
        run_dir = out / f"rank-{task}"
        ranking = rank(m, data, out=run_dir, progress=True)
        heads = ", ".join(f"L{layer}H{head}" for layer, head in ranking.top(top))
        print(f"[{task}] top {top} heads by mean RAM: {heads}")
        runs[task] = run_dir
    print("\nrun directories (heads.csv, ram.parquet, manifest.json, figures/):")
    for task, run_dir in runs.items():
        print(f"  {task:9s} {run_dir}")
    return runs
