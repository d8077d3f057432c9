"""`Scorer`: one way to score the heads of a model on data, as small registered plain data.

The contract every scorer keeps (`corelens rank --score NAME`, `cl.rank(m, data, score=...)`):

- A scorer is a frozen dataclass of its settings with a registered `name` (`@register`). `to_dict()` is
  `{"name": ..., **settings}` and `Scorer.from_dict(d)` builds the registered class back from it; a rank run
  records it in its manifest's settings (key `score`, so a resumed run refuses another scorer) and `corelens
  export` in headset.json's `provenance["score"]`. `from_config(cfg)` builds it from a `RankConfig`, taking
  the config's fields that are named like the scorer's settings (so a setting is one field of `RankConfig`).
- `score(m, samples, job)` returns the run's records: one dict per sample with an `"id"` and a `"status"`,
  `"ok"` or `"skipped"` (with a `"reason"`). An ok record holds the sample's `"task"`, `"n_omega"`,
  `"n_visual"` (0 where the score needs no Omega) and three (layers, query heads) arrays as nested lists:
  `"mass"`, the score itself (higher = the head matters more: keep it full), and `"share"`, `"lift"`
  (NaN where the score has none). Ranking, KV heads (`kv_rule` over each sample's query heads), bootstrap
  intervals and P(top-k) are computed from these records by `rank()`, identically for every scorer: the
  score of a head is its mean over the ok records, and the records are the bootstrap's units.
- The default `score` drives a resumable sample loop (`job.drive`): it prepares each sample with
  `prepare(m, sample, job)` and logs `measure(m, sample, prepared, job)`'s record. A scorer that needs a
  training loop or many forwards over all samples at once overrides `score` and returns its records the
  same way (one per sample where it can: per-sample values make the intervals; one record with id "all"
  gives a heads.csv without intervals or P(top-k)), logging what it needs to resume under `job.run` (None: no output folder).
- Attention is read inside the one registered attention function (probes of `corelens.attention.probes`),
  never as an N x N matrix.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from corelens.errors import InputError
from corelens.models.prepare import prepare, prompt_length
from corelens.registry import NamedClasses, Registry, refuse_unknown_fields
from corelens.runs.driver import Loop

if TYPE_CHECKING:
    from corelens.data.sample import Sample
    from corelens.experiments.configs import RankConfig
    from corelens.models.loaded import Loaded
    from corelens.models.prepare import Prepared
    from corelens.runs import Run
    from corelens.runs.context import RunContext


class ScorerInterface(NamedClasses, Registry):
    """name -> Scorer class (`corelens.registry.Registry`), keyed by each class' `name`."""

    kind = "head scorer"


SCORERS = ScorerInterface()
register = ScorerInterface.register


@dataclass
class ScoreJob:
    """What a scorer runs under: the rank settings `cfg`, the run context `ctx`, the open run (None without an
    output folder) and the samples the reader skipped. `drive(loop)` runs a resumable sample loop in it."""

    cfg: RankConfig
    ctx: RunContext
    run: Run | None = None
    samples: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    cache: dict = field(default_factory=dict)

    def shared(self, key: str, make: Callable[[], Any]) -> Any:
        """Return the object stored under `key`, made by `make()` the first time (a probe shared by samples)."""
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]

    def drive(self, loop) -> list[dict]:
        """Run `loop` (`corelens.runs.driver.Loop`) over `samples` in the job's run; return every record."""
        return self.ctx.drive(loop, self.samples, self.run, self.skipped)


@dataclass(frozen=True)
class Scorer(abc.ABC):
    """Base class of a head score (module docstring: the contract): a scorer defines `score`, or derives from
    `SampleScorer` and defines `measure` (one record per sample)."""

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""  # the score in a sentence or a figure title, e.g. "RAM"

    @abc.abstractmethod
    def score(self, m: Loaded, samples: list[Sample], job: ScoreJob) -> list[dict]:
        """Return the run's records (module docstring)."""

    def omega(self, m: Loaded, sample: Sample, prepared: Prepared, job: ScoreJob) -> tuple[Any, str | None]:
        """Return (Omega's token positions, None) or (None, why the sample is skipped): Omega from the targets,
        or estimated from the model with `--omega causal` (`cfg.omega_settings`)."""
        settings = job.cfg.omega_settings
        if settings is not None:
            from corelens.capture.omega import estimate_omega

            # The driver's prompt is Omega's own unless the answer was appended to it (--query answer).
            own = None if job.cfg.query == "answer" else prepared
            tokens, _ = estimate_omega(m, sample, settings, job.cfg.padding, own)
            if not len(tokens):
                return None, "estimated Ω is empty: no visual cell lowers the answer's log-probability"
            return tokens, None
        if not sample.targets:
            # A question kept for scoring without evidence (MMLongBench-Doc "[]"): the score needs Ω.
            return None, f"no evidence target: {self.label} needs Ω"
        return prepared.layout.omega(sample.targets, job.cfg.rule, sample=sample.id), None

    def skip(self, sample: Sample, reason: str) -> dict:
        """Return the record of a sample the score cannot use."""
        return {"id": sample.id, "status": "skipped", "line": sample.line, "reason": reason}

    @classmethod
    def from_config(cls, cfg: Any) -> Scorer:
        """Return the scorer with the settings of `cfg` (a `RankConfig`) named like its fields."""
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(cls) if f.init and hasattr(cfg, f.name)})

    def to_dict(self) -> dict:
        """Return the scorer as JSON-ready data, its registered `name` first."""
        return {"name": self.name, **json.loads(json.dumps(asdict(self)))}

    @classmethod
    def from_dict(cls, data: dict) -> Scorer:
        """Return the scorer of `to_dict` data; on `Scorer` itself, the class its `name` registers."""
        data = dict(data)
        name = data.pop("name", cls.name)
        target = SCORERS[name] if cls is Scorer or name != cls.name else cls
        refuse_unknown_fields(target, data, f"head scorer {name!r}", "setting")
        return target(**data)


@dataclass(frozen=True)
class SampleScorer(Scorer):
    """A scorer of one record per sample, measured in a resumable sample loop (`measure`)."""

    def score(self, m: Loaded, samples: list[Sample], job: ScoreJob) -> list[dict]:
        """Return the run's records: `measure` of each sample, in a resumable loop (`job.drive`)."""

        def step(sample: Sample, done: set[str], prepared: Prepared) -> list[dict]:
            return [self.measure(m, sample, prepared, job)]

        loop = Loop(
            "rank",
            step,
            length=partial(prompt_length, m),
            prepare=lambda sample: self.prepare(m, sample, job),
            check=partial(check_record, m.num_layers, m.num_heads),
        )
        job.samples = samples
        return job.drive(loop)

    def prepare(self, m: Loaded, sample: Sample, job: ScoreJob) -> Prepared:
        """Return the prompt `measure` reads: the answer appended (teacher-forced) for `--query answer`."""
        answer = sample.answer if job.cfg.query == "answer" else None
        return prepare(m, sample, answer=answer, padding=job.cfg.padding)

    @abc.abstractmethod
    def measure(self, m: Loaded, sample: Sample, prepared: Prepared, job: ScoreJob) -> dict:
        """Return one sample's record (module docstring)."""


@dataclass(frozen=True)
class ForcedScorer(SampleScorer):
    """A per-sample scorer that reads the gold answer's rows: the answer is appended (teacher forcing)
    whatever `--query` says, and a sample without one is refused in one line naming it."""

    def prepare(self, m: Loaded, sample: Sample, job: ScoreJob) -> Prepared:
        """Return the prompt with the gold answer appended."""
        if sample.answer is None:
            raise InputError(
                f"the {self.label} needs an answer", file=sample.source, line=sample.line, sample=sample.id
            )
        return prepare(m, sample, answer=sample.answer, padding=job.cfg.padding)


def scorer_of(score: str | Scorer | dict, cfg: Any = None) -> Scorer:
    """Return the scorer `score` names (settings from `cfg`), is, or describes (a `to_dict` dict)."""
    if isinstance(score, Scorer):
        return score
    if isinstance(score, dict):
        return Scorer.from_dict(score)
    cls = SCORERS[score]
    return cls.from_config(cfg) if cfg is not None else cls()


def check_record(layers: int, heads: int, record: dict) -> None:
    """Raise ValueError naming the field when a logged rank record's per-head arrays are not `layers` x
    `heads` numbers (a resumed run reads records it did not write in this process).

    Examples:
        >>> check_record(1, 2, {"mass": [[0.5, 0.1]], "share": [[1, 0]], "lift": [[2, 0]]})
        >>> check_record(1, 2, {"mass": [0.5, 0.1], "share": [[1, 0]], "lift": [[2, 0]]})
        Traceback (most recent call last):
        ...
        ValueError: field 'mass': expected 1 x 2 numbers, got shape (2,)
    """
    for name in ("mass", "share", "lift"):
        try:
            values = np.asarray(record[name], dtype=np.float64)
        except KeyError:
            raise ValueError(f"field {name!r} is missing") from None
        except (TypeError, ValueError):
            raise ValueError(f"field {name!r}: not an array of numbers") from None
        if values.shape != (layers, heads):
            raise ValueError(f"field {name!r}: expected {layers} x {heads} numbers, got shape {values.shape}")
