"""The demo: held-out samples of three tasks, `rank` on each, their stability, causal ablation on each task,
hybrid attention on the document task, and one HTML report.

The default model is the bundled model organism (`corelens.organism.organism_path()`): a small
Qwen2.5-VL trained from scratch on these tasks (see its CARD.md), so its head ranking reflects heads that
learned to retrieve the visual evidence. Should the checkpoint be missing (a source tree without it), the
demo falls back to a tiny randomly initialised checkpoint and says so: then the rankings mean nothing.
"""

from __future__ import annotations

from pathlib import Path

from corelens.experiments.ablate import sweep
from corelens.experiments.hybrid import curve
from corelens.experiments.rank import rank
from corelens.experiments.stability import stability
from corelens.models.loaded import Loaded, load
from corelens.models.tiny import build_tiny_checkpoint
from corelens.organism import CHECKPOINT
from corelens.organism.tasks import TASKS, WORDS, generate
from corelens.report.html import write_report

ORGANISM_LABEL = "corelens model organism (Qwen2.5-VL, 4 layers x 8 heads, trained from scratch; see CARD.md)"
RANDOM_LABEL = "tiny randomly initialised Qwen2.5-VL (organism checkpoint missing: rankings are meaningless)"
DEMO_SEED = 1  # held out: the organism was trained on seed 0
EVAL_SEED = 3  # the ablation / hybrid samples: other than those the heads were ranked on
HEAD_COUNTS = ("1", "3", "5")  # heads ablated in the demo's sweeps
HYBRID_KEEPS = ("3", "8", "16")  # heads kept full (the document needs about 8 of 32 with W = 16)
# RAM query rows per task. Image and video: the answer tokens, since the organism retrieves the asked word
# at the restated key, its first answer token ("red" in "red circle"); the question rows find weaker, less
# causal heads there. Document: the question rows (the default, docs/methods.md#ram), whose top heads are as causal and
# are the ones a hybrid policy must keep (benchmarks/organism/queries.sh and hybrid.sh).
DEMO_QUERY = {"image": "answer", "video": "answer", "document": "question"}


def default_model(folder: Path) -> tuple[Path, str]:
    """Return the demo model folder and its label: the organism, else a random checkpoint built in `folder`."""
    if (CHECKPOINT / "config.json").is_file():
        return CHECKPOINT, ORGANISM_LABEL
    if not (folder / "config.json").exists():
        build_tiny_checkpoint(
            "qwen2_5_vl", folder, words=WORDS, layers=4, heads=8, kv_heads=2, hidden=128, head_dim=16
        )
    return folder, RANDOM_LABEL


def _print_means(task: str, name: str, table, column: str, how: str) -> None:
    means = table.groupby(["set", column], sort=False)["accuracy"].mean()
    cells = ", ".join(
        f"{kind}: {acc:.0%}" if kind in ("none", "dense") else f"{kind} {k}: {acc:.0%}"
        for (kind, k), acc in means.items()
    )
    print(f"[{task} {name}] accuracy by head set ({how}): {cells}")


def sweeps(m: Loaded, out: Path, task: str, ranked: Path, n: int, hybrid: bool) -> dict[str, Path]:
    """Ablate (and, with `hybrid`, keep full) the top / bottom / random heads of `task` on other samples."""
    data = generate(task, out / "data" / f"{task}-eval", n, seed=EVAL_SEED)
    heads = ranked / "heads.csv"
    sets = ("top", "bottom", "random")
    runs = {f"ablate-{task}": out / f"ablate-{task}"}
    table = sweep(m, data, heads, ks=HEAD_COUNTS, sets=sets, seeds=2, out=runs[f"ablate-{task}"]).table
    _print_means(task, "ablate", table, "k", "zeroed")
    if hybrid:
        runs[f"hybrid-{task}"] = out / f"hybrid-{task}"
        keeps = [k for k in HYBRID_KEEPS if int(k) < m.num_layers * m.num_heads]  # a small model keeps fewer
        result = curve(
            m, data, heads, keeps=keeps, sets=sets, seeds=2, sink=4, window=16, out=runs[f"hybrid-{task}"]
        )
        _print_means(task, "hybrid", result.table, "keep", "kept full, S=4 W=16")
    return runs


def run_demo(
    out: str | Path,
    *,
    model: str | Path | None = None,
    n: int = 8,
    top: int = 5,
    load_options: dict | None = None,
) -> dict[str, Path]:
    """Run the demo into `out`; return the run directory of each task."""
    out = Path(out)
    if model is None:
        model_dir, label = default_model(out / "model")
    else:
        model_dir, label = model, str(model)
    m = load(model_dir, **(load_options or {}))
    print(f"model: {label}\n  at {m.path} ({m.dtype}, {m.device})")
    runs = {}
    for task in TASKS:
        data = generate(task, out / "data" / task, n, seed=DEMO_SEED)
        run_dir = out / f"rank-{task}"
        ranking = rank(m, data, query=DEMO_QUERY[task], out=run_dir, progress=True, overlays=1, explorer=200)
        best = ranking.heads.head(top)
        heads = ", ".join(
            f"L{int(r.layer)}H{int(r.head)} ({r.mass:.2f}, lift {r.lift:.1f})" for r in best.itertuples()
        )
        print(
            f"[{task}] top {top} heads by mean RAM of the {DEMO_QUERY[task]} rows (mass, lift over the area prior): {heads}"
        )
        runs[task] = run_dir
    for task in TASKS:
        runs.update(sweeps(m, out, task, runs[task], n, hybrid=task == "document"))
    runs["stability"] = out / "stability"
    result = stability([runs[t] for t in TASKS], runs["stability"], k="10%", n_boot=500)
    for row in result.spearman.itertuples():
        print(f"[stability] {row.a} vs {row.b}: Spearman {row.spearman:.2f} [{row.low:.2f}, {row.high:.2f}]")
    universal = ", ".join(f"L{layer}H{head}" for layer, head in result.universal) or "none"
    print(f"[stability] heads in the top 10 % of every task: {universal}")
    print("\nrun directories (tables, manifest.json, figures/):")
    for name, run_dir in runs.items():
        print(f"  {name:9s} {run_dir}")
    report = write_report(list(runs.values()), out / "report.html", title=f"corelens demo: {label}")
    print(f"report: {report}")
    return runs
