"""SAP sweep and key-region ratio (docs/methods.md#sap): accuracy with priors in place of learned visual attention.

Per sample: the unmodified model's greedy answer (the evaluation harness), its key-region ratio at the
answer position (Σ_Ω A / Σ_V A, per layer and head from a RAM probe, averaged) against the area prior
|Ω| / |V|, and one greedy answer per (prior, layer set) with `SapHook` active. The priors (`vis_attn`,
`complexity`, `noise`, `key` and the `own` control) are the registered classes of
`corelens.policies.sap_priors`, whose docstring defines each.

The temperature T (`prior_temperature`, default 1) sets the strength of `key` and `complexity`: their inputs
lie in [0, 1], so at T = 1 the largest and smallest weights differ by at most e and the prior is close to
uniform; T = 0.1 allows e^10. Writes sap.parquet, accuracy.csv, key_region.csv, priors.csv (each prior's
mass on Ω against the area share |Ω| / |V| and the model's own share Σ_Ω A / Σ_V A) and a figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from corelens.attention import RamProbe, activate
from corelens.attention.priors import CONVENTIONS, parse_heads, parse_layers
from corelens.attention.prompt_context import AttentionContext, attention_context
from corelens.choices import PRIOR_NAMES, PRIORS
from corelens.data.sample import Sample
from corelens.errors import CorelensError, InputError
from corelens.experiments.loading import run_loaded
from corelens.experiments.policy_sweep import answer_each
from corelens.metrics.answers import interval, score
from corelens.models.loaded import Loaded, load
from corelens.models.prepare import Prepared, prepare, prompt_length
from corelens.policies import SharedPrior
from corelens.policies.sap_priors import (  # noqa: F401  (the priors' public names, as before they moved)
    TEMPERED,
    build_prior,
    prior_complexity,
    prior_key,
    prior_noise,
    prior_vis_attn,
)
from corelens.runs import model_data_settings
from corelens.runs.context import RunContext
from corelens.runs.driver import Loop
from corelens.runs.outputs import SAP, conclude


def key_region(
    m: Loaded, sample: Sample, prepared: Prepared | None = None, probe: RamProbe | None = None
) -> tuple[float, float]:
    """Return (key-region ratio Σ_Ω A / Σ_V A at the answer position, averaged over layers and heads, |Ω|/|V|).

    `probe`: a `RamProbe(layers, heads)` built without positions, shared by a run's samples."""
    prepared = prepared or prepare(m, sample)
    omega = prepared.layout.omega(sample.targets, sample=sample.id)
    visual = prepared.layout.visual
    if not len(omega):
        raise InputError(
            "the targets cover no visual token", file=sample.source, line=sample.line, sample=sample.id
        )
    probe = probe if probe is not None else RamProbe(m.num_layers, m.num_heads)
    context = AttentionContext.of(prepared, omega=omega, sample=sample, query_rows=prepared.rows("last"))
    with torch.no_grad(), attention_context(context), activate(m.layer_modules(), probe):
        m.model(**prepared.to(m.device), use_cache=False, logits_to_keep=1)
    mass, vis = probe.mass.double().numpy(), probe.visual_mass.double().numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(vis > 0, mass / vis, np.nan)
    return float(np.nanmean(ratio)), len(omega) / len(visual)


@dataclass(frozen=True)
class Condition:
    """One SAP setting: a prior on a layer set and head set, under a convention."""

    prior: str
    layers: str
    heads: str = "all"
    convention: str = "mass"

    @property
    def name(self) -> str:
        """Return a label like "noise@21-27" (heads / convention appended when not the defaults)."""
        extra = ("" if self.heads == "all" else f"/h{self.heads}") + (
            "" if self.convention == "mass" else f"/{self.convention}"
        )
        return f"{self.prior}@{self.layers}{extra}"

    def policy(self, seed: int = 0, temperature: float = 1.0) -> SharedPrior:
        """Return the SAP policy of this setting (`seed`: the noise prior's; `temperature`: key, complexity)."""
        return SharedPrior(self.prior, self.layers, self.heads, self.convention, seed, temperature)


def measure_sample(
    m: Loaded,
    sample: Sample,
    conditions: Sequence[Condition],
    *,
    scorer: str = "auto",
    max_new_tokens: int = 8,
    seed: int = 0,
    temperature: float = 1.0,
    prepared: Prepared | None = None,
    probe: RamProbe | None = None,
) -> dict:
    """Return one sample's record: vanilla answer, key-region ratio, area prior, answers per condition.

    `prior_omega` holds each prior's mass on Ω and `prior_spread` its largest / smallest weight; `prepared`
    is the sample as the driver prepared it (prepared here when not given); `probe` the run's key-region
    probe (`key_region`).
    """
    if sample.answer is None:
        raise InputError(
            "SAP needs an answer to score", file=sample.source, line=sample.line, sample=sample.id
        )
    prepared = prepared if prepared is not None else prepare(m, sample)
    # The unmodified model and every condition's policy, answered from the one prepared prompt (the policy
    # sweep's step, `corelens.experiments.policy_sweep.answer_each`; equal policies would share an answer).
    policies = [None, *(cond.policy(seed, temperature) for cond in conditions)]
    todo = [(policy, policy) for policy in policies]
    vanilla, *preds = [
        text for text, _ in answer_each(m, prepared, sample, todo, max_new_tokens=max_new_tokens)
    ]
    ratio, area = key_region(m, sample, prepared, probe) if sample.targets else (float("nan"), float("nan"))
    priors: dict[str, np.ndarray | None] = {}
    for cond in conditions:
        if cond.prior not in priors:
            priors[cond.prior] = build_prior(
                m, sample, prepared, cond.prior, seed=seed, temperature=temperature
            )
    answers = {
        cond.name: {"prediction": pred, "correct": score(pred, sample.answer, sample.choices, scorer)}
        for cond, pred in zip(conditions, preds)
    }
    in_omega = (
        np.isin(prepared.layout.visual, prepared.layout.omega(sample.targets, sample=sample.id))
        if sample.targets
        else None
    )
    shown = {k: v for k, v in priors.items() if v is not None}
    return {
        "id": sample.id,
        "task": sample.task,
        "status": "ok",
        "gold": sample.answer,
        "prior_omega": {
            k: float(v[in_omega].sum()) if in_omega is not None else float("nan") for k, v in shown.items()
        },
        "prior_spread": {k: float(v.max() / v.min()) for k, v in shown.items()},
        "vanilla": {"prediction": vanilla, "correct": score(vanilla, sample.answer, sample.choices, scorer)},
        "key_ratio": ratio,
        "area": area,
        "conditions": answers,
    }


@dataclass
class SapResult:
    """SAP tables: per sample and condition, accuracy per condition, key-region ratio by correctness, priors."""

    frame: pd.DataFrame
    accuracy: pd.DataFrame
    key_region: pd.DataFrame
    priors: pd.DataFrame


PRIOR_COLUMNS = ["prior", "temperature", "n", "omega_mass", "area_share", "model_share", "lift", "spread"]


def prior_table(records: Sequence[dict], temperature: float) -> pd.DataFrame:
    """Return, per prior, its mean mass on Ω beside the area share |Ω| / |V| and the model's own Ω share.

    `model_share` is the key-region ratio Σ_Ω A / Σ_V A of the unmodified model (answer position, mean over
    layers and heads); `lift` = omega_mass / area_share, 1 for a uniform prior; `spread` is the median over
    samples of the prior's largest / smallest weight. Samples without targets are left out.
    """
    rows = []
    kinds = list(dict.fromkeys(k for r in records for k in r.get("prior_omega", {})))
    for kind in kinds:
        got = [r for r in records if kind in r["prior_omega"] and not np.isnan(r["prior_omega"][kind])]
        mass = np.array([r["prior_omega"][kind] for r in got])
        area = np.array([r["area"] for r in got])
        rows.append(
            {
                "prior": kind,
                "temperature": temperature if kind in TEMPERED else float("nan"),
                "n": len(got),
                "omega_mass": float(mass.mean()) if len(got) else float("nan"),
                "area_share": float(area.mean()) if len(got) else float("nan"),
                "model_share": float(np.mean([r["key_ratio"] for r in got])) if len(got) else float("nan"),
                "lift": float((mass / area).mean()) if len(got) else float("nan"),
                "spread": float(np.median([r["prior_spread"][kind] for r in got]))
                if len(got)
                else float("nan"),
            }
        )
    return pd.DataFrame(rows, columns=PRIOR_COLUMNS)


def sap_frame(records: Sequence[dict], conditions: Sequence[Condition]) -> pd.DataFrame:
    """Return the long table: one row per sample and condition (vanilla included)."""
    rows = []
    for r in records:
        base = {
            "sample_id": r["id"],
            "task": r["task"],
            "gold": r["gold"],
            "vanilla_correct": r["vanilla"]["correct"],
        }
        blank = {"prior": "", "layers": "", "heads": "", "convention": ""}
        rows.append({**base, "condition": "vanilla", **blank, **r["vanilla"]})
        for c in conditions:
            setting = {"prior": c.prior, "layers": c.layers, "heads": c.heads, "convention": c.convention}
            rows.append({**base, "condition": c.name, **setting, **r["conditions"][c.name]})
    return pd.DataFrame(rows)


def accuracy_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Return accuracy (95 % Wilson interval), change against vanilla and share of changed answers per condition."""
    out = []
    vanilla = frame[frame["condition"] == "vanilla"].set_index("sample_id")
    base = float(vanilla["correct"].mean()) if len(vanilla) else float("nan")
    for name, part in frame.groupby("condition", sort=False):
        n, k = len(part), int(part["correct"].sum())
        low, high = interval(k, n)
        same = (
            part.set_index("sample_id")["prediction"]
            == vanilla["prediction"].reindex(part["sample_id"]).values
        )
        out.append(
            {
                "condition": name,
                "n": n,
                "correct": k,
                "accuracy": k / n if n else float("nan"),
                "ci_low": low,
                "ci_high": high,
                "delta_vs_vanilla": (k / n - base) if n else float("nan"),
                "changed_answers": float(1 - same.mean()) if n else float("nan"),
            }
        )
    return pd.DataFrame(out)


def key_region_table(records: Sequence[dict]) -> pd.DataFrame:
    """Return the mean key-region ratio and area prior for correctly / incorrectly answered samples."""
    df = pd.DataFrame(
        [{"correct": r["vanilla"]["correct"], "ratio": r["key_ratio"], "area": r["area"]} for r in records]
    )
    out = []
    for group, part in (
        (("correct", df[df["correct"]]), ("incorrect", df[~df["correct"]]), ("all", df)) if len(df) else ()
    ):
        part = part.dropna()
        out.append(
            {
                "group": group,
                "n": len(part),
                "key_ratio": part["ratio"].mean() if len(part) else float("nan"),
                "area_prior": part["area"].mean() if len(part) else float("nan"),
                "lift": (part["ratio"] / part["area"]).mean() if len(part) else float("nan"),
            }
        )
    return pd.DataFrame(out, columns=["group", "n", "key_ratio", "area_prior", "lift"])


def sap(
    m: Loaded,
    data: str | Path,
    *,
    priors: Sequence[str] = PRIORS,
    layers: Sequence[str] = ("late",),
    heads: str = "all",
    convention: str = "mass",
    prior_temperature: float = 1.0,
    scorer: str = "auto",
    max_new_tokens: int = 8,
    seed: int = 0,
    ctx: RunContext | None = None,
    **context,
) -> SapResult:
    """Evaluate `m` on `data` unmodified and under each (prior, layer set); with `ctx.out`, write a run dir.

    `ctx` is the run (`RunContext`); its fields may also be given as keywords (`out=`, `skip_bad=`, ...).
    """
    ctx = RunContext.of(ctx, **context)
    for p in priors:
        if p not in PRIOR_NAMES:
            raise CorelensError(f"unknown prior {p!r}; expected one of {', '.join(PRIOR_NAMES)}")
    if convention not in CONVENTIONS:
        raise CorelensError(f"unknown convention {convention!r}; expected one of {CONVENTIONS}")
    if not prior_temperature > 0:
        raise CorelensError(f"--prior-temperature must be positive, got {prior_temperature}")
    for spec in layers:
        parse_layers(spec, m.num_layers)  # fail before any sample runs
    parse_heads(heads, m.num_heads)
    conditions = [Condition(p, spec, heads, convention) for p in priors for spec in layers]
    samples, skipped = ctx.read(data)
    run = None
    if ctx.out is not None:
        settings = {
            **model_data_settings(m, data),
            "priors": list(priors),
            "layers": list(layers),
            "heads": heads,
            "convention": convention,
            "prior_temperature": prior_temperature,
            "scorer": scorer,
            "max_new_tokens": max_new_tokens,
            "limit": ctx.limit,
            "skip_bad": ctx.skip_bad,
            "seed": seed,
        }
        run = ctx.open("sap", settings, device=m.device)

    probe = RamProbe(m.num_layers, m.num_heads)  # one key-region probe: each forward's context gives the sets

    def step(sample: Sample, done: set[str], prepared: Prepared) -> list[dict]:
        record = measure_sample(
            m,
            sample,
            conditions,
            scorer=scorer,
            max_new_tokens=max_new_tokens,
            seed=seed,
            temperature=prior_temperature,
            prepared=prepared,
            probe=probe,
        )
        return [record]

    loop = Loop("sap", step, length=partial(prompt_length, m), prepare=partial(prepare, m))
    records = ctx.drive(loop, samples, run, skipped)
    ok = [r for r in records if r.get("status") == "ok"]
    frame = sap_frame(ok, conditions)
    result = SapResult(frame, accuracy_table(frame), key_region_table(ok), prior_table(ok, prior_temperature))

    def draw(paths: dict[str, Path]) -> None:
        from corelens.report.geometry import sap_accuracy

        sap_accuracy(result.accuracy, paths["sap_accuracy"])

    tables = {
        "frame": frame,
        "accuracy": result.accuracy,
        "key_region": result.key_region,
        "priors": result.priors,
    }
    n_skipped = sum(1 for r in records if r.get("status") == "skipped")
    conclude(run, SAP, tables, draw=draw, samples=len(ok), skipped=n_skipped)
    return result


def sap_path(
    model: str | Path, data: str | Path, out: str | Path, *, load_options: dict | None = None, **kwargs
) -> SapResult:
    """Load `model` (with `load()`'s `load_options`) and run the SAP sweep on `data` into run directory `out`."""
    return sap(load(model, **(load_options or {})), data, out=out, **kwargs)


def run_command(config, ctx: RunContext, load_options: dict) -> SapResult:
    """`corelens sap`: the config's (`SapConfig`) model loaded, `sap` run on its data under `ctx`."""
    return run_loaded(sap, config, ctx, load_options)
