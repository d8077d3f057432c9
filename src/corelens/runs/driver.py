"""The one sample loop: read -> resume -> shard over ranks -> step -> skip bad input -> log -> merge.

Every experiment (rank, ablate, hybrid, flow, sap) describes what it does with one sample as a `Loop` and hands
it to `drive`, the way TransformerLens specialises one generic patching driver with `partial`. The driver owns
everything around the step, once:

- resume: a sample whose record ids are all in the run's logs is not run again; a sample killed half-way
  (some conditions logged) runs only its missing ids;
- sharding: under torchrun each rank takes a deterministic share of the samples still to do, balanced by
  prompt length (measured once, spread over the ranks, cached in `lengths.json`);
- bad input: an `InputError` stops the run (naming the rank under torchrun), or with `skip_bad` is logged as a
  skipped record and the loop goes on; with `skip_bad` any other failure of one sample is skipped the same way;
- logging: each record is appended and fsynced by the process that made it, before the next starts;
- the result: after every rank has finished, all records of the run in sample order (then record order
  within a sample), whichever rank or earlier run wrote them, so that the tables built from them do not
  depend on the number of processes;
- the count: how many samples were used and how many skipped, by reason (`Tally`, printed with `progress`);
  a run that used no sample (an empty file, or every sample skipped) is an `InputError` naming the file and
  the reasons, before any table is written from nothing.

Examples:
    >>> from corelens.data.sample import Sample
    >>> from corelens.runs.driver import Loop, drive
    >>> samples = [Sample(id=f"s{i}", task="image", question="q", answer="a") for i in range(3)]
    >>> loop = Loop("echo", lambda s, done: [{"id": s.id, "status": "ok", "n": len(s.id)}])
    >>> [r["id"] for r in drive(loop, samples)]
    ['s0', 's1', 's2']
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from corelens.data.sample import Sample
from corelens.errors import InputError
from corelens.runs.dist import Dist, balance
from corelens.runs.rundir import LOG, Run, write_json

LENGTHS = "lengths.json"


def _own_id(sample: Sample) -> list[str]:
    return [sample.id]


def _sample_id(sample: Sample) -> str:
    return sample.id


@dataclass(frozen=True)
class Loop:
    """What an experiment does with one sample.

    `step(sample, done)` yields the records (dicts with a unique "id" and a "status") of `sample` whose ids
    are not in `done`; with `prepare` set, the driver prepares each sample it runs once (`prepare(sample)`,
    e.g. `models.prepare.prepare` with the experiment's options) and calls `step(sample, done, prepared)`, so
    that no consumer inside the step prepares the sample again; `keys(sample)` lists the ids a finished sample has, in output order; `skip_key(sample)`
    is the id of the record that says the sample was skipped as bad input; `length(sample)` is its prompt
    length in tokens, which balances the ranks' shares (None: equal counts).
    """

    name: str
    step: Callable[[Sample, set[str]], Iterable[dict]]
    keys: Callable[[Sample], Sequence[str]] = _own_id
    skip_key: Callable[[Sample], str] = _sample_id
    length: Callable[[Sample], int] | None = None
    prepare: Callable[[Sample], object] | None = None
    check: Callable[[dict], None] | None = None  # a record read back from the log: raises naming its field

    def run(self, sample: Sample, done: set[str]) -> Iterable[dict]:
        """Return the step's records of `sample`, prepared once here when the loop prepares."""
        if self.prepare is None:
            return self.step(sample, done)
        return self.step(sample, done, self.prepare(sample))

    def finished(self, sample: Sample, done: set[str]) -> bool:
        """Return True when `sample` needs no more work (every record logged, or skipped)."""
        return self.skip_key(sample) in done or all(k in done for k in self.keys(sample))


def prompt_lengths(
    samples: Sequence[Sample], length: Callable[[Sample], int], run: Run | None = None
) -> dict[str, int | None]:
    """Return each sample's prompt length (None where its input is bad), measured once over all ranks.

    Each rank measures every world-th sample not yet in the run's `lengths.json`; rank 0 stores the union.
    """
    dist = run.dist if run is not None else Dist()
    cache = run.path / LENGTHS if run is not None else None
    known: dict[str, int | None] = (
        json.loads(cache.read_text()) if cache is not None and cache.is_file() else {}
    )
    missing = [s for s in samples if s.id not in known]
    mine: dict[str, int | None] = {}
    for sample in missing[dist.rank :: dist.world]:
        try:
            mine[sample.id] = int(length(sample))
        except InputError:
            mine[sample.id] = None  # the step meets the same error and reports or skips it
    for part in dist.gather(mine):
        known.update(part)
    if missing and cache is not None and dist.main:
        write_json(cache, known, root=run.path)
    dist.barrier()
    return {s.id: known.get(s.id) for s in samples}


def shard(loop: Loop, todo: Sequence[Sample], run: Run | None) -> list[Sample]:
    """Return this rank's share of `todo` (all of it for a single process), in sample order."""
    dist = run.dist if run is not None else Dist()
    if dist.world == 1:
        return list(todo)
    if loop.length is None:
        costs = [1.0] * len(todo)
    else:
        lengths = prompt_lengths(todo, loop.length, run)
        costs = [float(lengths[s.id] or 0) for s in todo]
    return [todo[i] for i in balance(costs, dist.world)[dist.rank]]


def estimate(label: str, first: float, left: int, say: Callable[[str], None], *, above: float = 60.0) -> None:
    """Say how long the samples `left` will take at the first one's `first` seconds, when that is over `above`.

    Examples:
        >>> estimate("rank", 98.0, 31, print)
        rank: the first sample took 98 s; the 31 left need about 51 min at that rate
        >>> estimate("rank", 0.5, 31, print)  # half a minute in all: the bar says enough
    """
    total = first * left
    if total <= above:
        return
    when = f"{total / 3600:.1f} h" if total >= 5400 else f"{total / 60:.0f} min"
    say(f"{label}: the first sample took {first:.0f} s; the {left} left need about {when} at that rate")


def drive(
    loop: Loop,
    samples: Sequence[Sample],
    *,
    run: Run | None = None,
    skipped: Sequence = (),
    skip_bad: bool = False,
    progress: bool = False,
) -> list[dict]:
    """Run `loop` over the samples not yet done, on this rank's share; return every record of the run.

    The returned records (finished and skipped, of all ranks and earlier runs) come in sample order, then in
    `loop.keys` order; records of input lines that could not be read (`skipped`) come first.
    """
    dist = run.dist if run is not None else Dist()
    done = run.done() if run is not None else set()
    if run is not None:
        run.log_skipped(skipped, done)
    memory: list[dict] = [
        {"id": f"<skipped line {bad.line}>", "status": "skipped", **bad.to_dict()} for bad in skipped
    ]

    def log(record: dict) -> None:
        done.add(record["id"])
        if run is not None:
            run.log(record)
        else:
            memory.append(record)

    todo = [s for s in samples if not loop.finished(s, done)]
    mine = shard(loop, todo, run)
    label = loop.name + (f" [{dist.label}]" if dist.world > 1 else "")
    bar = tqdm(mine, desc=label, unit="sample", disable=not progress or not dist.main)
    for i, sample in enumerate(bar):
        t0 = time.perf_counter()
        try:
            for record in loop.run(sample, done):
                log(record)
                condition, _, _ = record["id"].rpartition("|")
                if condition and not bar.disable:  # a sweep: which of a sample's conditions has answered
                    bar.set_postfix_str(condition)
        except Exception as err:
            # Bad input is an InputError (one line at the CLI); with skip_bad any failure of one sample
            # (a decoder, a processor's shape check, a recursion or memory limit) skips that sample only.
            if not skip_bad:
                raise
            record = {
                "id": loop.skip_key(sample),
                "status": "skipped",
                "line": sample.line,
                "error": _reason(err, sample),
                "reason": err.reason if isinstance(err, InputError) else f"{type(err).__name__}: {err}",
            }
            log(record | ({"rank": dist.rank} if dist.world > 1 else {}))
        if run is not None:
            run.stats["samples"] += 1
            run.stats["seconds"] = round(run.stats["seconds"] + time.perf_counter() - t0, 3)
        if i == 0 and not bar.disable:
            estimate(label, time.perf_counter() - t0, len(mine) - 1, bar.write)
    dist.barrier()
    records = ordered(loop, samples, run.records(loop.check) if run is not None else memory)
    tally = Tally.of(loop, samples, records, run.path / LOG if run is not None else None)
    source = samples[0].source if samples else (skipped[0].file if skipped else None)
    tally.require(source)
    if progress and dist.main:
        print(tally, flush=True)
    return records


@dataclass
class Tally:
    """How many samples a run used, and how many it skipped by reason (read-time skips included)."""

    used: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> count
    log: Path | None = None  # where each skipped sample's record, with its full reason, is

    @classmethod
    def of(cls, loop: Loop, samples: Sequence[Sample], records: Iterable[dict], log: Path | None = None):
        """Count the `records` of `samples` (those `drive` returns): a sample with an "ok" record is used."""
        owner = {key: sample.id for sample in samples for key in loop.keys(sample)}
        used = {owner[r["id"]] for r in records if r.get("status") == "ok" and r["id"] in owner}
        reasons = Counter(skip_reason(r) for r in records if r.get("status") == "skipped")
        return cls(len(used), reasons, log)

    def reasons(self, shown: int = 3) -> str:
        """`reason: count, ...`, the commonest `shown` reasons first, then how many other reasons there are."""
        common = self.skipped.most_common()
        text = ", ".join(f"{reason}: {n}" for reason, n in common[:shown])
        return text + (f", {len(common) - shown} other reasons" if len(common) > shown else "")

    def __str__(self) -> str:
        """`N samples used, M skipped (reason: count, ...), see samples.jsonl`."""
        text = f"{self.used} samples used, {sum(self.skipped.values())} skipped"
        if self.skipped:
            text += f" ({self.reasons()})" + (f", see {self.log}" if self.log is not None else "")
        return text

    def require(self, source: str | None) -> None:
        """Raise an InputError naming `source` when no sample was used: nothing to measure or score."""
        if self.used:
            return
        if not self.skipped:
            raise InputError("no samples: the file holds no records (or --limit is 0)", file=source)
        see = f"; see {self.log}" if self.log is not None else ""
        raise InputError(
            f"no sample could be used: all {sum(self.skipped.values())} were skipped ({self.reasons()}){see}",
            file=source,
        )


def skip_reason(record: dict) -> str:
    """A skipped record's reason without its place (file, line, sample, field), so that equal reasons count
    together: the step's own "reason", else the error less the location a read-time skip recorded beside it."""
    if record.get("reason"):
        return str(record["reason"])
    error = str(record.get("error") or "unknown")
    place = {
        k: record.get(f)
        for k, f in (("file", "file"), ("line", "line"), ("sample", "sample_id"), ("field", "field"))
    }
    return error.removeprefix(str(InputError("", **place)))


def _reason(err: Exception, sample: Sample) -> str:
    """The skipped record's reason: an InputError's own line, or the failure located at the sample."""
    if isinstance(err, InputError):
        return str(err)
    where = InputError("", file=sample.source or None, line=sample.line or None, sample=sample.id)
    return f"{where}{type(err).__name__}: {err}"


def ordered(loop: Loop, samples: Sequence[Sample], records: Iterable[dict]) -> list[dict]:
    """Return the records of `samples` in sample order, then `loop.keys` order (read-time skips first)."""
    place: dict[str, tuple[int, int]] = {}
    for i, sample in enumerate(samples):
        place[loop.skip_key(sample)] = (i, -1)
        for j, key in enumerate(loop.keys(sample)):
            place[key] = (i, j)
    kept = []
    for record in records:
        if record["id"] in place:
            kept.append((place[record["id"]], record))
        elif record["id"].startswith("<skipped line"):
            kept.append(((-1, int(record.get("line") or 0)), record))
    return [record for _, record in sorted(kept, key=lambda pair: pair[0])]
