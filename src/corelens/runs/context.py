"""`RunContext`: what every experiment is run within, passed once instead of six parameters each.

The output folder (None: nothing written), the command line recorded in the manifest, whether to show
progress, whether bad samples are skipped, how many samples to use and the per-sample resource bounds, and
the processes of a torchrun launch. An experiment reads its samples (`read`), opens its run folder (`open`)
and drives its loop (`drive`) through it.

Examples:
    >>> from corelens.runs.context import RunContext
    >>> ctx = RunContext.of(None, skip_bad=True, limit=3)
    >>> ctx.skip_bad, ctx.limit, ctx.out
    (True, 3, None)
    >>> RunContext.of(ctx, progress=True).limit  # keyword arguments given beside a context amend a copy
    3
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from corelens.data.sample import Limits, Sample, read_samples
from corelens.runs.dist import Dist, current
from corelens.runs.driver import Loop, drive
from corelens.runs.rundir import Run


@dataclass(frozen=True)
class RunContext:
    """The run an experiment writes into and the rules it reads its samples by."""

    out: str | Path | None = None  # run folder (resumed if it exists); None: tables are returned, not written
    argv: list[str] | None = None  # the command line the manifest records (None: sys.argv)
    progress: bool = False  # a progress bar and the used / skipped count
    skip_bad: bool = False  # log and skip a bad sample instead of stopping
    limit: int | None = None  # use the first N good samples
    limits: Limits | None = None  # per-sample resource bounds (None: the defaults)
    dist: Dist | None = None  # the ranks of a torchrun launch (None: the current launch)

    @classmethod
    def of(cls, ctx: RunContext | None = None, **given) -> RunContext:
        """Return `ctx` (or a default context) with the fields in `given` replaced (None values are left out,
        so that an entry point's unset keyword arguments keep the context's own)."""
        base = ctx if ctx is not None else cls()
        changes = {k: v for k, v in given.items() if v is not None}
        unknown = set(changes) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unknown run context fields: {', '.join(sorted(unknown))}")
        return dataclasses.replace(base, **changes) if changes else base

    @property
    def launch(self) -> Dist:
        """The processes of this run (the current torchrun launch unless one was given)."""
        return self.dist if self.dist is not None else current()

    @property
    def main(self) -> bool:
        """True in the process that writes the tables and prints: the only one, or rank 0."""
        return self.launch.main

    def read(self, data: str | Path) -> tuple[list[Sample], list]:
        """Return the good samples of `data` (at most `limit`) and the lines skipped as bad."""
        return read_samples(data, skip_bad=self.skip_bad, limit=self.limit, limits=self.limits)

    def open(self, command: str, settings: dict, device: object = None) -> Run | None:
        """Return the run folder `out` for `command` with `settings` (resumed, or refused when they differ);
        None when the context writes nothing."""
        if self.out is None:
            return None
        return Run(self.out, command, settings, self.argv, dist=self.launch, device=device)

    def drive(
        self, loop: Loop, samples: Sequence[Sample], run: Run | None, skipped: Sequence = ()
    ) -> list[dict]:
        """Run `loop` over `samples` under this context (resume, shard, skip bad input, log); every record."""
        return drive(loop, samples, run=run, skipped=skipped, skip_bad=self.skip_bad, progress=self.progress)
