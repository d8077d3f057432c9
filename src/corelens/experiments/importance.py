"""Causal importance beside RAM: each head's single-head effect on the answer (docs/importance.md).

For every sample of `data` (samples the ranking did not use) and every head of the rank run's heads.csv, the
head alone is intervened on with `ablate` (`zero` or `knockout`, `attention.interventions`) and two things
are measured against the unmodified model:

- the drop in the gold answer's log-probability, teacher-forced: the sample is prepared with its answer
  appended (`prepare(..., answer=...)`, as `rank --query answer` does) and log p is the sum over the answer's
  tokens of log softmax of the logits at the position before each (fp64, as `capture.omega.answer_logprob`);
- the drop in greedy accuracy (`evaluate.answer` + `evaluate.score`): 1 when the model was right and is no
  longer, -1 the other way.

`method` "attribution" (or "both") adds attribution patching (`attention.attribution.HeadGate`): the gradient
of log p with respect to a gate on each head's output, from one forward and one backward per sample, as the
first-order estimate of every head's log-p effect. The run is resumable: a sample's baseline record and each
(head, sample) record are logged before the next starts.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from corelens.attention.attribution import GATED_OPS, HeadGate
from corelens.attention.prompt_context import AttentionContext, attention_context
from corelens.data.sample import Sample
from corelens.errors import InputError, OptionError
from corelens.errors import warn as default_warn
from corelens.experiments.ablate import (
    heads_settings,
    operator_policy,
    rank_manifest,
    read_heads,
    same_file_warning,
)
from corelens.experiments.evaluate import answer
from corelens.metrics.answers import score
from corelens.metrics.causal_effects import agreement, estimator_agreement, importance_table
from corelens.metrics.posterior import few_samples
from corelens.metrics.ram import read_ram
from corelens.metrics.rank_agreement import sample_matrix
from corelens.models.loaded import Loaded, load
from corelens.models.prepare import Prepared, prepare, prompt_length
from corelens.policies import Policy
from corelens.runs import current, model_data_settings
from corelens.runs.context import RunContext
from corelens.runs.driver import Loop
from corelens.runs.outputs import IMPORTANCE, RANK, conclude

ESTIMATORS = ("exact", "attribution", "both")
BASE = "base"
RECORD_COLUMNS = [
    "sample", "task", "layer", "head", "logp_base", "logp", "drop_logp", "correct_base", "correct",
    "drop_acc", "attribution", "prediction_base", "prediction", "gold",
]  # fmt: skip


def answer_logp(m: Loaded, forced: Prepared) -> torch.Tensor:
    """Return log p(gold answer | prompt) of a teacher-forced prepared sample (a 0-d fp64 tensor).

    The answer's tokens are the last rows of `forced` (`answer_rows`); each is scored by the logits of the
    position before it. Gradients flow when called under `torch.enable_grad()`.
    """
    rows = forced.answer_rows
    keep = forced.seq_len - int(rows[0]) + 1  # the row before the first answer token, through the last
    inputs = forced.to(m.device)
    logits = m.model(**inputs, use_cache=False, logits_to_keep=keep).logits[0, :-1].double()
    ids = inputs["input_ids"][0, torch.as_tensor(rows, device=inputs["input_ids"].device)]
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, None].to(logits.device)).sum()


def blocked_positions(sample: Sample, prepared: Prepared, op: str, keys: str) -> np.ndarray | None:
    """Return the key positions a knockout blocks (the visual tokens, or Omega); None for `zero`."""
    if op != "knockout":
        return None
    if keys == "omega":
        return prepared.layout.omega(sample.targets, "any", sample=sample.id)
    return np.asarray(prepared.layout.visual)


def attribution(m: Loaded, sample: Sample, forced: Prepared, op: str, keys: str) -> np.ndarray:
    """Return (layers, heads): the attribution estimate of each head's drop in log p (one forward + backward).

    The estimate of log p(head intervened) - log p is d log p / d s_h at s = 0 (`HeadGate`); the drop is its
    negative.
    """
    gate = HeadGate(m, op, keys=keys)  # a knockout blocks the context's visual tokens or Omega
    gate.gates.requires_grad_(True)
    omega = partial(forced.layout.omega, sample.targets, "any", sample=sample.id)  # computed when read
    context = AttentionContext.of(forced, omega=omega, sample=sample)
    with torch.enable_grad(), attention_context(context), gate.installed():
        answer_logp(m, forced).backward()
    return -gate.gates.grad.detach().cpu().numpy().astype(np.float64)


def head_key(head: tuple[int, int], sample_id: str) -> str:
    """Return the record id of one head's effect on one sample."""
    return f"L{head[0]}H{head[1]}|{sample_id}"


def _check_samples(samples: list[Sample], data: str | Path, op: str, keys: str) -> None:
    missing = [s.id for s in samples if s.answer is None]
    if missing:
        raise InputError(
            f"{len(missing)} sample(s) have no answer to score against", file=str(data), sample=missing[0]
        )
    if op == "knockout" and keys == "omega" and not any(s.targets for s in samples):
        raise InputError(
            "no sample has target boxes: --keys omega knocks out the keys under them", file=str(data)
        )


def _same_data(data: str | Path, heads: str | Path, allow: bool, warn: Callable[[str], None]) -> str | None:
    """Refuse (or with `allow` warn) when `data` is the file the heads were ranked on; say so when unknown."""
    identified = rank_manifest(heads)
    if not identified:
        message = (
            f"no rank manifest.json next to {heads}: cannot check that the heads were ranked on other data"
        )
        warn(message)
        return message
    same = same_file_warning(data, identified)
    if same and not allow:
        raise OptionError(f"--data: {same} (--allow-same-data measures on it anyway)")
    if same:
        warn(same)
    return same


def _records(logged: list[dict], heads: list[tuple[int, int]]) -> pd.DataFrame:
    """Return the per-(sample, head) table: exact effects where measured, attribution estimates where made."""
    bases = {r["sample"]: r for r in logged if r["status"] == "ok" and r["kind"] == BASE}
    exact = {
        (r["sample"], r["layer"], r["head"]): r for r in logged if r["status"] == "ok" and r["kind"] == "head"
    }
    rows = []
    for sample, b in bases.items():
        estimate = np.asarray(b["attribution"]) if b.get("attribution") is not None else None
        for layer, head in heads:
            e = exact.get((sample, layer, head))
            rows.append(
                {
                    "sample": sample, "task": b["task"], "layer": layer, "head": head,
                    "logp_base": b["logp"], "logp": e["logp"] if e else np.nan,
                    "drop_logp": b["logp"] - e["logp"] if e else np.nan,
                    "correct_base": b["correct"], "correct": e["correct"] if e else None,
                    "drop_acc": int(b["correct"]) - int(e["correct"]) if e else np.nan,
                    "attribution": float(estimate[layer, head]) if estimate is not None else np.nan,
                    "prediction_base": b["prediction"], "prediction": e["prediction"] if e else None,
                    "gold": b["gold"],
                }
            )  # fmt: skip
    return pd.DataFrame(rows, columns=RECORD_COLUMNS)


def _matrix(records: pd.DataFrame, column: str) -> np.ndarray | None:
    """Return the (samples, heads) matrix of `column`, heads in (layer, head) order; None when never measured."""
    if records.empty or records[column].isna().all():
        return None
    wide = records.pivot_table(index="sample", columns=["layer", "head"], values=column, aggfunc="mean")
    return wide.sort_index(axis=1).to_numpy(np.float64)


def _ram_matrix(heads: str | Path) -> np.ndarray | None:
    """Return the rank run's (samples, heads) RAM matrix from ram.parquet beside heads.csv, if it is there."""
    path = RANK.path(Path(heads).parent, "ram")
    return sample_matrix(read_ram(path)) if path.is_file() else None


def measure(
    m: Loaded,
    data: str | Path,
    heads: str | Path,
    *,
    op: str = "zero",
    keys: str = "visual",
    method: str = "both",
    scorer: str = "auto",
    max_new_tokens: int = 8,
    allow_same_data: bool = False,
    draws: int = 1000,
    seed: int = 0,
    warn: Callable[[str], None] = default_warn,
    ctx: RunContext | None = None,
    **context,
) -> dict:
    """Measure every head's single-head effect on `data`; return {"table", "records", "summary"}.

    With `ctx.out`, a resumable run directory: samples.jsonl, records.parquet, importance.csv, summary.json
    and figures/ram_vs_causal.png. `ctx` is the run (`RunContext`); its fields may also be given as keywords
    (`out=`, `skip_bad=`, `limit=`, ...).
    """
    ctx = RunContext.of(ctx, **context)
    if op not in GATED_OPS:
        raise OptionError(f"--op must be one of {GATED_OPS} (single-head effects), got {op!r}")
    if method not in ESTIMATORS:
        raise OptionError(f"--method must be one of {ESTIMATORS}, got {method!r}")
    table = read_heads(heads, m, "query")
    grid = sorted((int(r.layer), int(r["head"])) for _, r in table.iterrows())
    if len(grid) != m.num_layers * m.num_heads:
        raise InputError(
            f"{len(grid)} heads ranked; the importance table needs every one of the model's "
            f"{m.num_layers * m.num_heads} (a rank run's heads.csv)",
            file=str(heads),
        )
    warning = _same_data(data, heads, allow_same_data, warn)
    samples, skipped = ctx.read(data)
    _check_samples(samples, data, op, keys)
    exact, gradient = method in ("exact", "both"), method in ("attribution", "both")

    run = None
    if ctx.out is not None:
        identified = rank_manifest(heads)
        settings = {
            **model_data_settings(m, data),
            **heads_settings(heads, identified),
            "op": op,
            "keys": keys if op == "knockout" else "",
            "method": method,
            "scorer": scorer,
            "max_new_tokens": max_new_tokens,
            "limit": ctx.limit,
            "skip_bad": ctx.skip_bad,
        }
        run = ctx.open("importance", settings, device=m.device)
        if warning and run.dist.main and warning not in run.manifest.setdefault("warnings", []):
            run.manifest["warnings"].append(warning)

    def step(sample: Sample, done: set[str], both: tuple[Prepared, Prepared]) -> Iterator[dict]:
        prepared, forced = both  # the prompt, and the prompt with the gold answer teacher-forced
        blocked = blocked_positions(sample, forced, op, keys)  # bad Omega fails here, before any record

        def measured(policy: Policy | None) -> tuple[float, str, bool]:
            if policy is None:
                with torch.no_grad():
                    logp = float(answer_logp(m, forced))
            else:
                with torch.no_grad(), policy.applied(m, forced, sample=sample):
                    logp = float(answer_logp(m, forced))
            prediction = answer(m, sample, max_new_tokens=max_new_tokens, prepared=prepared, policy=policy)
            return logp, prediction, bool(score(prediction, sample.answer, sample.choices, scorer))

        if f"{BASE}|{sample.id}" not in done:
            logp, prediction, correct = measured(None)
            record = {
                "id": f"{BASE}|{sample.id}", "status": "ok", "kind": BASE, "sample": sample.id,
                "task": sample.task, "logp": logp, "prediction": prediction, "gold": sample.answer,
                "correct": correct, "blocked": None if blocked is None else len(blocked),
            }  # fmt: skip
            if gradient:
                record["attribution"] = attribution(m, sample, forced, op, keys).tolist()
            yield record
        for head in grid if exact else ():
            if head_key(head, sample.id) in done:
                continue
            logp, prediction, correct = measured(operator_policy(op, keys or "visual", (head,)))
            yield {
                "id": head_key(head, sample.id), "status": "ok", "kind": "head", "sample": sample.id,
                "layer": head[0], "head": head[1], "logp": logp, "prediction": prediction, "correct": correct,
            }  # fmt: skip

    loop = Loop(
        "importance",
        step,
        keys=lambda s: [f"{BASE}|{s.id}", *(head_key(h, s.id) for h in grid if exact)],
        skip_key=lambda s: f"skipped|{s.id}",
        length=partial(prompt_length, m),
        prepare=lambda s: (prepare(m, s), prepare(m, s, answer=s.answer)),
    )
    if ctx.progress and ctx.main:  # minutes on a real model: say what it will run before it starts
        each = (
            f"{1 + len(grid)} answers (the model as it is and {len(grid)} single-head ablations)"
            if exact
            else "1 answer"
        )
        backward = " and one backward (attribution)" if gradient else ""
        print(f"importance: per sample {each}{backward} x {len(samples)} samples; the first sample's time gives "
              "the estimate of the rest", file=sys.stderr, flush=True)  # fmt: skip
    logged = ctx.drive(loop, samples, run, skipped)
    records = _records(logged, grid)
    logp, acc, estimate = (_matrix(records, c) for c in ("drop_logp", "drop_acc", "attribution"))
    result = importance_table(table, logp, acc, estimate, draws=draws, seed=seed)
    effects = logp if logp is not None else estimate
    summary = agreement(result, effects, _ram_matrix(heads), draws=draws, seed=seed)
    summary.update(
        samples=int(records["sample"].nunique()),
        op=op,
        method=method,
        effect="exact" if exact else "attribution",
    )
    if exact and gradient:
        summary["attribution_vs_exact"] = estimator_agreement(logp, estimate)
    few = few_samples(summary["samples"], "importance table", "intervals")
    if few and (run is None or run.dist.main):  # once, not by every rank
        warn(few)

    def draw(paths: dict[str, Path]) -> None:
        from corelens.report.ram_vs_causal import ram_vs_causal

        ram_vs_causal(result, paths["ram_vs_causal"], summary, title=Path(data).name)

    tables = {"records": records, "table": result, "summary": summary}
    n_skipped = sum(1 for r in logged if r["status"] == "skipped")
    conclude(run, IMPORTANCE, tables, draw=draw, samples=summary["samples"], skipped=n_skipped)
    return {"table": result, "records": records, "summary": summary}


def sentence(summary: dict) -> str:
    """Return the one-line result: the Spearman of RAM and causal importance and the most disagreeing heads."""
    said = ", ".join(
        f"{d['head']} (RAM rank {d['ram_rank']}, causal {d['causal_rank']})" for d in summary["disagree"][:3]
    )
    text = (
        f"RAM and causal importance ({summary['op']}, {summary['effect']} log-p drop, {summary['samples']} samples) "
        f"agree with Spearman {summary['spearman']:.2f} [{summary['low']:.2f}, {summary['high']:.2f}]; "
        f"most disagreeing heads: {said}"
    )
    versus = summary.get("attribution_vs_exact")
    if versus:
        text += f"; attribution vs exact: Spearman {versus['spearman_heads']:.2f} over heads"
    return text


def measure_path(
    model: str | Path,
    data: str | Path,
    heads: str | Path,
    out: str | Path,
    *,
    load_options: dict | None = None,
    **kwargs,
) -> dict:
    """Load `model` (with `load()`'s `load_options`) and measure importance into run directory `out`.

    The heads' own ranking data is refused before the model loads (`measure` checks again and warns).
    """
    _same_data(data, heads, kwargs.get("allow_same_data", False), warn=lambda message: None)
    result = measure(load(model, **(load_options or {})), data, heads, out=out, **kwargs)
    if current().main:
        print(sentence(result["summary"]), file=sys.stderr)
    return result


def run_command(config, ctx: RunContext, load_options: dict) -> dict:
    """`corelens importance`: measure the config's (`ImportanceConfig`) model on its data under `ctx`."""
    return measure_path(
        config.model,
        config.data,
        config.heads,
        ctx.out,
        ctx=ctx,
        load_options=load_options,
        **config.kwargs(),
    )
