"""`ram`: Retrieval Attention Mass, the mean attention of the probed rows on Omega (docs/methods.md#ram).

One probed forward per sample (`RamProbe`): besides the mass on Omega, the record keeps the visual share and
lift, and per view of the prompt (`Layout.views()`) the view's mass and its mass on Omega.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from corelens.attention import RamProbe, activate
from corelens.attention.prompt_context import AttentionContext, attention_context
from corelens.data.sample import Sample
from corelens.errors import InputError
from corelens.experiments.scorers.base import SampleScorer, ScoreJob, register
from corelens.models.loaded import Loaded
from corelens.models.prepare import Prepared, prepare


@dataclass
class SampleRam:
    """RAM of one sample: (layers, heads) arrays of mass, visual share and lift, and the set sizes.

    Per view (`views`: labels of `Layout.views()`): `view_mass` (layers, heads, views, 2) holds each view's
    mass and its mass on Ω; `view_tokens` / `view_omega` count the view's tokens in V and in Ω.
    """

    mass: np.ndarray
    share: np.ndarray
    lift: np.ndarray
    n_omega: int
    n_visual: int
    views: list[str] = field(default_factory=list)
    view_mass: np.ndarray | None = None
    view_tokens: list[int] = field(default_factory=list)
    view_omega: list[int] = field(default_factory=list)


def measure_sample(
    m: Loaded,
    sample: Sample,
    query: str = "question",
    rule: str = "any",
    padding: str = "visual",
    omega: np.ndarray | None = None,
    prepared: Prepared | None = None,
    probe: RamProbe | None = None,
) -> SampleRam:
    """Return the RAM of every (layer, query head) for one sample, from a single probed forward.

    `padding` is the padding-cell rule of Omega and V (`corelens.layout.PADDING_RULES`); `omega`, if given,
    is an estimated Omega (token positions, `corelens.capture.omega`) used instead of the targets'.
    `probe`: a `RamProbe(layers, heads, views=True)` built without positions, shared by a run's samples.

    Examples:
        >>> import corelens as cl
        >>> from corelens.organism import quickstart
        >>> m, samples = quickstart(getfixture("tmp_path"), 1)
        >>> r = cl.measure_sample(m, samples[0], query="answer")
        >>> r.mass.shape, r.n_omega, r.n_visual
        ((4, 8), 1, 36)
        >>> r.mass[0].round(2).tolist()  # layer 0: heads 5 and 7 put half their attention on Ω
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.15, 0.5]
    """
    prepared = prepared if prepared is not None else prepare_for(m, sample, query, padding)
    if query == "answer" and sample.answer is None:
        raise InputError(
            "query 'answer' needs an answer", file=sample.source, line=sample.line, sample=sample.id
        )
    omega = prepared.layout.omega(sample.targets, rule, sample=sample.id) if omega is None else omega
    visual = prepared.layout.visual
    if not len(omega):
        raise InputError(
            "the targets cover no visual token", file=sample.source, line=sample.line, sample=sample.id
        )
    views = prepared.layout.views()
    probe = probe if probe is not None else RamProbe(m.num_layers, m.num_heads, views=True)
    # The probed rows may be the answer's: the context carries them, with this sample's Omega.
    context = AttentionContext.of(prepared, omega=omega, sample=sample, query_rows=prepared.rows(query))
    with torch.no_grad(), attention_context(context), activate(m.layer_modules(), probe):
        m.model(**prepared.to(m.device), use_cache=False, logits_to_keep=1)
    mass = probe.mass.double().numpy()
    vis = probe.visual_mass.double().numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(vis > 0, mass / vis, np.nan)
    lift = share / (len(omega) / len(visual))
    return SampleRam(
        mass,
        share,
        lift,
        len(omega),
        len(visual),
        [label for label, _ in views],
        probe.view_mass.double().numpy(),
        [len(tokens) for _, tokens in views],
        [int(np.isin(tokens, omega).sum()) for _, tokens in views],
    )


def prepare_for(m: Loaded, sample: Sample, query: str = "question", padding: str = "visual") -> Prepared:
    """Prepare `sample` as RAM measures it: the answer appended for `query="answer"` (teacher forcing)."""
    return prepare(m, sample, answer=sample.answer if query == "answer" else None, padding=padding)


def _record(sample: Sample, result: SampleRam) -> dict:
    return {
        "id": sample.id,
        "task": sample.task,
        "status": "ok",
        "n_omega": result.n_omega,
        "n_visual": result.n_visual,
        "mass": result.mass.tolist(),
        "share": result.share.tolist(),
        "lift": result.lift.tolist(),
        "views": result.views,
        "view_mass": result.view_mass.tolist() if result.view_mass is not None else [],
        "view_tokens": result.view_tokens,
        "view_omega": result.view_omega,
    }


@register
@dataclass(frozen=True)
class Ram(SampleScorer):
    """RAM of each head: mean attention mass of the `--query` rows on Omega (the default score of `rank`)."""

    name: ClassVar[str] = "ram"
    label: ClassVar[str] = "RAM"

    def measure(self, m: Loaded, sample: Sample, prepared: Prepared, job: ScoreJob) -> dict:
        """Return the sample's RAM record; the probe is built once per job and shared by its samples."""
        cfg = job.cfg
        omega, reason = self.omega(m, sample, prepared, job)
        if omega is None:
            return self.skip(sample, reason)
        probe = job.shared("ram-probe", lambda: RamProbe(m.num_layers, m.num_heads, views=True))
        return _record(
            sample, measure_sample(m, sample, cfg.query, cfg.rule, cfg.padding, omega, prepared, probe)
        )
