"""Residual-stream geometry (docs/methods.md#geometry): per sample, layer and module RID / ΔS / ΔD / eRank / TME / MixIG.

One prefill per sample and baseline, with the residual states streamed layer by layer (`ResidualCapture`);
each state's spectrum and TME are computed once and shared by the two modules that meet at it. Baselines:
`none` (the model as it is; ε_RoPE, between the attention outputs with and without RoPE, is measured in
the same forward), `noise-delta` (every ΔX_attn replaced by Gaussian noise of its own scalar mean and std,
per layer and sample, propagating) and `noise-qkv` (every decoder q/k/v projection weight replaced by
Gaussian noise of its own mean and std, restored afterwards).
Writes flow.parquet (long), table1.csv (the shape of the paper's Table 1), layers.csv and a figure.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from corelens.capture import LayerStates, ResidualCapture
from corelens.choices import BASELINES, DEFAULT_ALPHA, POSITION_SETS, REFERENCES, ROPE_ON
from corelens.data.sample import Sample
from corelens.errors import CorelensError, InputError, OptionError
from corelens.experiments.loading import run_loaded
from corelens.metrics.mixing import MIXIG_OF, TME_ROWS, tme
from corelens.metrics.spectra import FP32_EPS, RANK_RULES, SPECTRUM_METHODS, Spectrum, rid_terms, spectrum
from corelens.models.loaded import Loaded, load
from corelens.models.prepare import Prepared, prepare, prompt_length
from corelens.runs import model_data_settings
from corelens.runs.context import RunContext
from corelens.runs.driver import Loop
from corelens.runs.outputs import FLOW, conclude

METRIC_COLUMNS = (
    "rid",
    "dS",
    "dD",
    "dD_token",
    "dD_hidden",
    "erank_in",
    "erank_out",
    "rank_in",
    "tme_in",
    "tme_out",
    "mixig",
)
# Paper Table 1, means over models (docs/methods.md#geometry): row -> (RID, MixIG).
PAPER_TABLE1 = {
    "attention": (0.06, 0.61),
    "FFN": (0.21, 0.02),
    "noise Δ": (0.61, -0.80),
    "noise QKV": (0.44, -0.50),
    "ε_RoPE": (0.062, math.nan),
}
TABLE1_ROWS = (
    ("attention", "none", "attn"),
    ("FFN", "none", "ffn"),
    ("noise Δ", "noise-delta", "attn"),
    ("noise QKV", "noise-qkv", "attn"),
    ("ε_RoPE", "none", "rope"),
)


@dataclass(frozen=True)
class FlowOptions:
    """The [decision] options of docs/methods.md#geometry, defaults first."""

    reference: str = "module"  # 'layer': the FFN is compared to the layer input (the authors' code)
    positions: str = "all"  # prompt positions whose states are measured: all, visual or text
    rank: str = "numerical"  # kept directions of X: 'numerical' (σ > max(S,H)·eps·σ_max) or 'energy'
    eps: float = FP32_EPS  # machine epsilon of the capture dtype (states are captured fp32)
    energy: float = 0.99
    tme_rows: str = "mean"  # 'last': TME of the last row only
    # TME sharpening exponent: at 1 (the unsharpened W) TME of real states is 0.99-1.00 and MixIG cannot move; 16
    # puts the median TME of the organism's layer inputs at 0.69 (results/tme-alpha.csv). Authors' code: 8.
    alpha: float = DEFAULT_ALPHA
    mixig_of: str = "output"  # 'delta': TME of ΔX instead of X'
    method: str = "auto"  # spectrum route: auto, gram, svd
    rope: bool = True  # measure ε_RoPE (baseline 'none' only)
    rope_on: str = "delta"  # 'residual': RID(X + Δ_noRoPE → X + Δ_RoPE) instead of RID(Δ_noRoPE → Δ_RoPE)
    seed: int = 0

    def check(self) -> None:
        """Raise ValueError on an option outside its choices."""
        choices = {
            "reference": REFERENCES,
            "positions": POSITION_SETS,
            "rank": RANK_RULES,
            "tme_rows": TME_ROWS,
            "mixig_of": MIXIG_OF,
            "rope_on": ROPE_ON,
            "method": SPECTRUM_METHODS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise OptionError(f"flow option {name}={getattr(self, name)!r}; expected one of {allowed}")


class _State:
    """One residual state with its spectrum and TME computed on first use (and then shared)."""

    def __init__(self, x: torch.Tensor, opts: FlowOptions) -> None:
        self.x = x
        self.opts = opts
        self._spectrum: Spectrum | None = None
        self._tme: float | None = None

    @property
    def spectrum(self) -> Spectrum:
        if self._spectrum is None:
            self._spectrum = spectrum(self.x, method=self.opts.method)
        return self._spectrum

    @property
    def tme(self) -> float:
        if self._tme is None:
            self._tme = tme(self.x, rows=self.opts.tme_rows, alpha=self.opts.alpha)
        return self._tme


# The options of FlowOptions that are `rid_terms`' keywords of the same names.
RID_OPTIONS = ("rank", "eps", "energy", "method")


def _rid(a: _State, b: _State, opts: FlowOptions) -> dict[str, float]:
    options = {name: getattr(opts, name) for name in RID_OPTIONS}
    t = rid_terms(a.x, b.x, spectrum_in=a.spectrum, spectrum_out=b.spectrum, **options)
    return {
        "rid": t.rid,
        "dS": t.dS,
        "dD": t.dD,
        "dD_token": t.dD_token,
        "dD_hidden": t.dD_hidden,
        "erank_in": t.erank_in,
        "erank_out": t.erank_out,
        "rank_in": t.rank,
    }


def module_metrics(a: _State, b: _State, opts: FlowOptions) -> dict[str, float]:
    """Return RID (with its parts), both eRanks, both TMEs and MixIG of the update a → b."""
    out = _rid(a, b, opts)
    if opts.mixig_of == "delta":
        t_out = tme(b.x - a.x, rows=opts.tme_rows, alpha=opts.alpha)
    else:
        t_out = b.tme
    return {**out, "tme_in": a.tme, "tme_out": t_out, "mixig": t_out - a.tme}


def sample_seed(seed: int, sample_id: str) -> int:
    """Return a per-sample seed that does not depend on the order of the sample file."""
    return (seed * 1_000_003 + zlib.crc32(sample_id.encode())) % (1 << 62)


def noise_delta(seed: int) -> Callable[[int, torch.Tensor], torch.Tensor]:
    """Return an `attn_delta` replacing ΔX_attn by Gaussian noise of its own scalar mean and std."""

    def replace(layer: int, delta: torch.Tensor) -> torch.Tensor:
        d = delta.float()
        generator = torch.Generator().manual_seed(seed * 4099 + layer)
        noise = torch.randn(delta.shape, generator=generator, dtype=torch.float32)
        return (noise.to(d.device) * d.std() + d.mean()).to(delta.dtype)

    return replace


@contextmanager
def noised_qkv(m: Loaded, seed: int = 0) -> Iterator[None]:
    """Replace every decoder q/k/v projection weight by Gaussian noise of its own mean / std; restore after."""
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    try:
        with torch.no_grad():
            for layer, attn in enumerate(m.attention_layers):
                for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
                    weight = getattr(attn, name).weight
                    if weight.device.type == "meta":
                        # accelerate keeps offloaded weights off the module until its forward: nothing to noise.
                        raise CorelensError(
                            f"baseline noise-qkv needs the decoder weights resident, but layer {layer}'s {name} "
                            "is offloaded by the device map; map every decoder layer to a device"
                        )
                    saved.append((weight, weight.detach().clone()))
                    w = weight.float()
                    generator = torch.Generator().manual_seed(seed * 1_000_003 + 3 * layer + j)
                    noise = torch.randn(weight.shape, generator=generator, dtype=torch.float32)
                    weight.copy_((noise.to(w.device) * w.std() + w.mean()).to(weight.dtype))
        yield
    finally:
        with torch.no_grad():
            for weight, original in saved:
                weight.copy_(original)


def _positions(prepared, which: str) -> torch.Tensor | None:
    if which == "all":
        return None
    visual = prepared.layout.visual
    if which == "visual":
        chosen = visual
    else:
        chosen = np.setdiff1d(np.arange(prepared.prompt_len), visual)
    if len(chosen) < 2:
        raise InputError(f"positions {which!r} select fewer than two tokens")
    return torch.from_numpy(np.asarray(chosen, dtype=np.int64))


def measure_flow(
    m: Loaded,
    sample: Sample,
    baseline: str = "none",
    opts: FlowOptions | None = None,
    prepared: Prepared | None = None,
) -> tuple[list[dict], int]:
    """Return (rows, measured tokens): one row per layer and module ('attn', 'ffn', and 'rope' = ε_RoPE);
    `prepared` is the sample as the driver prepared it (prepared here when not given)."""
    opts = opts or FlowOptions()
    if baseline not in BASELINES:
        raise OptionError(f"unknown baseline {baseline!r}; expected one of {BASELINES}")
    prepared = prepared if prepared is not None else prepare(m, sample)
    try:
        positions = _positions(prepared, opts.positions)
    except InputError as err:
        raise InputError(err.reason, file=sample.source, line=sample.line, sample=sample.id) from None
    rows: list[dict] = []
    prev: list[_State] = []

    def on_layer(states: LayerStates) -> None:
        # The next layer's input is the previous layer's output unless the model adds to it in between
        # (Qwen3-VL deepstack); reuse its spectrum and TME only when it is the same tensor.
        same = prev and torch.equal(prev[0].x, states.x_in)
        x_in = prev[0] if same else _State(states.x_in, opts)
        mid, out = _State(states.x_mid, opts), _State(states.x_out, opts)
        rows.append({"layer": states.layer, "module": "attn", **module_metrics(x_in, mid, opts)})
        ffn_in = x_in if opts.reference == "layer" else mid
        rows.append({"layer": states.layer, "module": "ffn", **module_metrics(ffn_in, out, opts)})
        if states.delta_norope is not None:
            # docs/methods.md#geometry: RID between the attention outputs with and without RoPE; 'residual' adds X to both
            # (the residual states the attention row compares), so the same change is a smaller share of the state.
            if opts.rope_on == "delta":
                plain, rotated = _State(states.delta_norope, opts), _State(states.delta, opts)
            else:
                plain, rotated = _State(states.x_mid_norope, opts), mid
            nan = {"tme_in": math.nan, "tme_out": math.nan, "mixig": math.nan}
            rows.append({"layer": states.layer, "module": "rope", **_rid(plain, rotated, opts), **nan})
        prev[:] = [out]

    seed = sample_seed(opts.seed, sample.id)
    capture = ResidualCapture(
        m,
        on_layer,
        positions=positions,
        attn_delta=noise_delta(seed) if baseline == "noise-delta" else None,
        norope=opts.rope and baseline == "none",
    )
    with torch.no_grad(), capture:
        m.model(**prepared.to(m.device), use_cache=False, logits_to_keep=1)
    tokens = prepared.seq_len if positions is None else len(positions)
    return rows, tokens


@dataclass
class FlowResult:
    """A flow result: the long per-sample table, the Table-1 summary and the per-layer means."""

    frame: pd.DataFrame
    table: pd.DataFrame
    layers: pd.DataFrame


def flow_frame(records: Sequence[dict]) -> pd.DataFrame:
    """Return the long table (sample, baseline, layer, module, metrics) from logged records."""
    rows = []
    for r in records:
        for row in r["rows"]:
            rows.append(
                {
                    "sample_id": r["sample_id"],
                    "task": r["task"],
                    "baseline": r["baseline"],
                    "tokens": r["tokens"],
                }
                | row
            )
    columns = ["sample_id", "task", "baseline", "tokens", "layer", "module", *METRIC_COLUMNS]
    return pd.DataFrame(rows, columns=columns)


def table1(frame: pd.DataFrame, opts: FlowOptions | None = None) -> pd.DataFrame:
    """Return the Table-1 analogue: mean RID / ΔS / ΔD / MixIG per row, with the paper's values beside.

    The TME sharpening α and the states ε_RoPE compares (`rope_on`) are written beside every row.
    """
    opts = opts or FlowOptions()
    out = []
    for name, baseline, module in TABLE1_ROWS:
        part = frame[(frame["baseline"] == baseline) & (frame["module"] == module)]
        per_sample = part.groupby("sample_id")[["rid", "dS", "dD", "mixig"]].mean()
        paper_rid, paper_mixig = PAPER_TABLE1[name]
        out.append(
            {
                "row": name,
                "baseline": baseline,
                "module": module,
                "samples": len(per_sample),
                "rid": per_sample["rid"].mean() if len(part) else math.nan,
                "rid_sd": per_sample["rid"].std() if len(part) else math.nan,
                "dS": per_sample["dS"].mean() if len(part) else math.nan,
                "dD": per_sample["dD"].mean() if len(part) else math.nan,
                "mixig": per_sample["mixig"].mean() if len(part) else math.nan,
                "mixig_sd": per_sample["mixig"].std() if len(part) else math.nan,
                "paper_rid": paper_rid,
                "paper_mixig": paper_mixig,
                "alpha": opts.alpha,
                "rope_on": opts.rope_on,
            }
        )
    return pd.DataFrame(out)


def layer_means(frame: pd.DataFrame) -> pd.DataFrame:
    """Return the per-(baseline, module, layer) means of every metric."""
    cols = ["rid", "dS", "dD", "erank_in", "erank_out", "tme_in", "tme_out", "mixig"]
    return frame.groupby(["baseline", "module", "layer"], as_index=False)[cols].mean()


def _key(baseline: str, sample: Sample) -> str:
    return f"{baseline}|{sample.id}"


def _keys(key: Callable[[Sample], str], sample: Sample) -> list[str]:
    return [key(sample)]


def _record(sample: Sample, baseline: str, rows: list[dict], tokens: int) -> dict:
    return {
        "id": f"{baseline}|{sample.id}",
        "sample_id": sample.id,
        "task": sample.task,
        "baseline": baseline,
        "status": "ok",
        "tokens": tokens,
        "rows": rows,
    }


def flow(
    m: Loaded,
    data: str | Path,
    *,
    baselines: Sequence[str] = BASELINES,
    options: FlowOptions | None = None,
    ctx: RunContext | None = None,
    **context,
) -> FlowResult:
    """Measure every decoder module of `m` on the samples of `data` under `baselines`; with `ctx.out`, a run
    dir. `ctx` is the run (`RunContext`); its fields may also be given as keywords (`out=`, `skip_bad=`, ...)."""
    ctx = RunContext.of(ctx, **context)
    opts = options or FlowOptions()
    opts.check()
    for b in baselines:
        if b not in BASELINES:
            raise CorelensError(f"unknown baseline {b!r}; expected one of {BASELINES}")
    samples, skipped = ctx.read(data)
    run = None
    if ctx.out is not None:
        settings = {
            **model_data_settings(m, data),
            "baselines": list(baselines),
            "limit": ctx.limit,
            "skip_bad": ctx.skip_bad,
            **asdict(opts),
        }
        run = ctx.open("flow", settings, device=m.device)
    logged: dict[str, dict] = {}  # every record once (read-time skips come back with each baseline)
    for i, baseline in enumerate(baselines):
        # One loop per baseline: noise-qkv replaces the weights once around all of its samples.
        def step(sample: Sample, done: set[str], prepared: Prepared, baseline: str = baseline) -> list[dict]:
            rows, tokens = measure_flow(m, sample, baseline, opts, prepared)
            return [_record(sample, baseline, rows, tokens)]

        key = partial(_key, baseline)
        keys = partial(_keys, key)
        length = partial(prompt_length, m)
        loop = Loop(
            f"flow {baseline}", step, keys=keys, skip_key=key, length=length, prepare=partial(prepare, m)
        )
        with noised_qkv(m, opts.seed) if baseline == "noise-qkv" else _nothing():
            records = ctx.drive(loop, samples, run, skipped if i == 0 else ())
        logged.update((r["id"], r) for r in records)
    ok = sorted(
        (r for r in logged.values() if r.get("status") == "ok"), key=lambda r: BASELINES.index(r["baseline"])
    )
    n_skipped = sum(1 for r in logged.values() if r.get("status") == "skipped")
    frame = flow_frame(ok)
    result = FlowResult(frame, table1(frame, opts), layer_means(frame))

    def draw(paths: dict[str, Path]) -> None:
        from corelens.report.geometry import flow_curves

        flow_curves(result.layers, paths["flow_layers"])

    tables = {"frame": frame, "table": result.table, "layers": result.layers}
    conclude(run, FLOW, tables, draw=draw, samples=len({r["sample_id"] for r in ok}), skipped=n_skipped)
    return result


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def flow_path(
    model: str | Path, data: str | Path, out: str | Path, *, load_options: dict | None = None, **kwargs
) -> FlowResult:
    """Load `model` (with `load()`'s `load_options`) and run `flow` on `data` into run directory `out`."""
    return flow(load(model, **(load_options or {})), data, out=out, **kwargs)


def run_command(config, ctx: RunContext, load_options: dict) -> FlowResult:
    """`corelens flow`: the config's (`FlowConfig`) model loaded, `flow` run on its data under `ctx`."""
    return run_loaded(flow, config, ctx, load_options)
