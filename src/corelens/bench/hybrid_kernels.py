"""Hybrid-attention benchmark: kernel and whole-decoder prefill times against stock sdpa and FlexAttention.

One run, one process, one set of random inputs (batch 1, `torch.no_grad()`, all cores; fp32 on the CPU by
default, `--device cuda --dtype bfloat16` for a GPU table, every time taken after a device synchronisation):

- **kernels** on post-RoPE-shaped random q (1, H, N, d) and un-repeated k, v (1, H_kv, N, d), realistic width
  (default 16 query heads over 2 KV heads, head_dim 128): ``sdpa`` = transformers' stock sdpa attention call;
  ``hybrid`` = corelens' `auto` kernel (the blocked path on the CPU, the partitioned kernel on CUDA; ``hybrid_kernel``
  records which ran); ``flex`` = FlexAttention compiled with ``torch.compile`` on the
  same per-head block mask. For each kept fraction F, round(F H) heads (a seeded random choice) are full.
  The hybrid and flex outputs are compared (``max_abs_diff_flex``);
- **prefill**: a random-weight Qwen2.5-VL text decoder (default 2 layers, hidden 2048, intermediate 5632),
  stock "sdpa" attention vs corelens' attention under `corelens.hybrid` with round(F L H) full heads
  (seeded random) over the whole model; ``prefill_flop_speedup`` is what the FLOP count predicts
  (projections, MLP and attention pairs; the pair counts of docs/methods.md#hybrid for the attention).
  ``prefill_granularities`` times query- and/or KV-granular head sets (asked and effective shares, KV-cache
  bytes kept); each layer's registered attention call is timed inside the forward and held against the
  kernel time of the same heads (``in_model_over_kernel``), and the torch.compile frames compiled during the
  timed repeats are counted (``compiles_timed``, ``prefill_compiles_timed``).
- **adaptive** (``--adaptive``): the same prefill under `AdaptiveHybrid(budget, <the fixed set>)`,
  which keeps the fixed policy's count of full heads in each layer and chooses which per prompt from the
  last 16 rows' attention mass on the visual tokens (docs/methods.md#adaptive-hybrid). The prompt then holds
  a visual block (an image-token id from position 16 to N − 64), so that the signal has something to measure.
  ``adaptive_over_fixed`` is the paired time ratio against the fixed policy: the selection's cost, plus any
  difference between the heads it keeps; ``selection_scores_fraction`` is its 16 · N scores per head of each
  choosing layer over the causal prefill's N (N + 1) / 2. With ``--adaptive`` the fixed and the adaptive
  prefills both start without a cached FlexAttention block mask, as a prompt of a new length does.

Every time is the median of `repeats` runs after one warm-up run of the same shape (the flex warm-up is its
compilation, timed apart as ``flex_compile_s``); variants are interleaved so load drift affects all alike,
and every ratio (speed-ups, hybrid vs flex) is the median of the ratios within each repeat (paired), so a
slow spell of the machine during one repeat moves both sides of its ratio.
If FlexAttention cannot compile here, ``flex_error`` says why and no flex number is given.

Run as ``corelens bench hybrid --tokens N --keep 0.05,0.1,0.2,0.5 --sink S --window W --json FILE``
(``python -m corelens bench hybrid`` from a source tree); ``corelens bench hybrid --table FILE...`` prints
the README table of saved results.
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import time
from typing import Any

import torch

from corelens.attention.kernels import Pattern, choose, flex, ideal_speedup, pairs, partition, prefill
from corelens.attention.kernels.crossover import device_name
from corelens.attention.kernels.flexattn import policy_block_mask
from corelens.attention.kernels.tiles import streaming_path
from corelens.bench.synthetic import Decoder, build_model, cores, make_input_ids, sync
from corelens.errors import CorelensError, OptionError
from corelens.metrics.headsets import k_value, parse_k

CPU = torch.device("cpu")


def _tokens(n: int) -> str:
    """A table's N: 32k for 32768, a dry run's small N as it is."""
    return f"{n // 1024}k" if n >= 1024 else str(n)


def refuse_fallback(reason: str | None, where: str) -> None:
    """Raise if the hybrid kernel fell back (`kernels.prefill`'s reason): a bench times what it names, or nothing."""
    if reason:
        raise CorelensError(
            f"{where}: the hybrid kernel fell back ({reason}); the benchmark refuses to time it"
        )


def check_backends(stock: str, hybrid: str, device: torch.device) -> None:
    """Raise on CUDA if the full heads' sdpa operators (`sdpa_backend`) differ from the stock call's.

    The hybrid's time is held against stock sdpa: its full heads must run on the same backend (cuDNN, flash...),
    or the ratio measures a backend, not the kernel. "none": no sdpa call (no full head), nothing to compare.
    """
    if device.type == "cuda" and hybrid not in ("none", stock):
        raise CorelensError(
            f"the full heads ran sdpa as {hybrid}, stock sdpa as {stock}: the benchmark needs one backend for both"
        )


def machine() -> dict[str, Any]:
    """Return platform, CPU model, cores and the load average at the start."""
    info: dict[str, Any] = {"platform": platform.platform(), "cores": cores()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        info["loadavg_start"] = os.getloadavg()
    except (OSError, StopIteration):
        pass
    return info


def with_visual_block(ids: torch.Tensor, token: int, head: int = 16, tail: int = 64) -> torch.Tensor:
    """Return `ids` with positions [head, N - tail) set to the visual token id (a prompt shaped like an image's)."""
    ids = ids.clone()
    ids[:, head : max(head, ids.shape[1] - tail)] = token
    return ids


def _busy_seconds() -> float | None:
    """Return the machine's busy CPU seconds so far (all processes, from /proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            ticks = list(map(int, f.readline().split()[1:]))
    except OSError:
        return None
    busy = sum(ticks) - ticks[3] - ticks[4]  # minus idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # the compiler runs of torch.compile
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _stub(groups: int) -> torch.nn.Module:
    """Return a stand-in attention module carrying what transformers' sdpa call reads."""
    module = torch.nn.Module()
    module.num_key_value_groups = groups
    module.is_causal = True
    return module


def choose_full(total: int, keep: float, seed: int, group: int = 1) -> list[int]:
    """Return round(keep * total) head indices, a seeded random choice.

    `group` > 1 (`--granularity kv`): round(keep * total / group) KV heads are chosen, and all `group`
    consecutive query heads of each (transformers' `repeat_kv` order) are returned.
    """
    units = total // group
    order = torch.randperm(units, generator=torch.Generator().manual_seed(seed))
    chosen = order[: round(keep * units)].tolist()
    return sorted(unit * group + i for unit in chosen for i in range(group))


def _group(granularity: str, heads: int, kv_heads: int) -> int:
    """Return the heads drawn together: a KV head's query heads at granularity "kv", else 1."""
    if granularity not in ("query", "kv"):
        raise OptionError(f"--granularity: expected query or kv, got {granularity!r}")
    if heads % kv_heads:
        raise OptionError(f"--heads {heads} do not split over --kv-heads {kv_heads}")
    return heads // kv_heads if granularity == "kv" else 1


def paired(numerator: list[float], denominator: list[float]) -> float:
    """Return the median over repeats of numerator[i] / denominator[i] (times taken in the same repeat)."""
    return statistics.median(a / b for a, b in zip(numerator, denominator, strict=True))


def _timed(fn, device: torch.device = CPU) -> tuple[float, Any]:
    """Return (seconds, result) of `fn()`, waiting for the device's queued work on both sides.

    On CUDA the time is that of CUDA events recorded around the call (the device's time, host launch gaps
    included), after a synchronisation.
    """
    sync(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000, out
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


def compiles() -> int:
    """Return how many frames torch.compile (dynamo) has compiled in this process so far: a new shape, head
    count or guard failure adds one, so a difference of 0 across timed repeats means nothing (re)compiled."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["total"])


class AttentionTimer:
    """Times every call of registered attention functions inside a model's forward, per decoder layer.

    `timing(names)` replaces transformers' registered functions `names` (the "corelens" one and stock
    "sdpa") by timed wrappers for the duration of a block, and puts the originals back after it; outside the
    block nothing is wrapped, so the hot path has no timing cost. On CUDA each call is bracketed by two CUDA
    events (recorded on the stream, no host synchronisation); `collect()` synchronises once and returns the
    seconds per layer. On other devices each call is timed with `perf_counter`, the device synchronised
    before and after it (a no-op on the CPU).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.clock = time.perf_counter  # an attribute, so that a test can give this timer alone its own clock
        self._calls: list[tuple[int, Any, Any]] = []

    @contextlib.contextmanager
    def timing(self, names: tuple[str, ...] = ("corelens", "sdpa")):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as functions

        saved = {name: functions._local_mapping.get(name) for name in names}
        for name in names:
            functions[name] = self._wrap(functions[name])
        try:
            yield self
        finally:
            for name, fn in saved.items():
                if fn is None:  # no local override before: the global registration shows through again
                    del functions[name]
                else:
                    functions[name] = fn

    def _wrap(self, fn):
        cuda = self.device.type == "cuda"

        def timed(module, *args, **kwargs):
            layer = getattr(module, "layer_idx", -1)
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = fn(module, *args, **kwargs)
                end.record()
                self._calls.append((layer, start, end))
                return out
            sync(self.device)
            begin = self.clock()
            out = fn(module, *args, **kwargs)
            sync(self.device)
            self._calls.append((layer, begin, self.clock()))
            return out

        return timed

    def collect(self) -> dict[int, float]:
        """Return the seconds of the calls timed since the last collect, summed per layer; forget them."""
        if self.device.type == "cuda" and self._calls:
            self._calls[-1][2].synchronize()
        per_layer: dict[int, float] = {}
        for layer, start, end in self._calls:
            seconds = start.elapsed_time(end) / 1000 if self.device.type == "cuda" else end - start
            per_layer[layer] = per_layer.get(layer, 0.0) + seconds
        self._calls.clear()
        return per_layer


def sdpa_backend(fn) -> str:
    """Return the sdpa operator(s) `fn()` dispatches to (cuDNN, flash, efficient or math), from the profiler."""
    from torch.profiler import profile

    with profile() as prof:
        fn()
    ops = sorted({e.name for e in prof.events() if e.name.startswith("aten::_scaled_dot_product_")})
    return ", ".join(ops) or "none"


def model_layout(batch: int, heads: int, tokens: int, dim: int, g, device, dtype) -> torch.Tensor:
    """Return random (batch, heads, tokens, dim) as the model passes it: a transposed view of (b, n, h, d)."""
    return torch.randn(batch, tokens, heads, dim, generator=g).to(device, dtype).transpose(1, 2)


def plan_seconds(
    kernel: str, full: torch.Tensor, tokens: int, kv_heads: int, pattern: Pattern, device
) -> dict:
    """Return the seconds to build each kernel's masks / plan for one layer from empty caches."""
    dev = str(device)
    policy_block_mask.cache_clear()
    flags = tuple(bool(x) for x in full.tolist())
    out = {"flex": _timed(lambda: policy_block_mask(flags, tokens, pattern, dev), device)[0]}
    if choose(kernel, torch.device(device)) == "partitioned":  # `auto` on CUDA is the partitioned kernel
        for cached in (partition.layout, partition.window_block_mask, partition.sink_block_mask):
            cached.cache_clear()

        def plan():
            partition.layout(flags, kv_heads, dev)
            partition.window_block_mask(tokens, pattern, dev)
            if pattern.sink and tokens > pattern.window:
                partition.sink_block_mask(tokens, pattern, dev)

        out["partitioned"] = _timed(plan, device)[0]
    return out


def kernel_times(
    tokens: int,
    keeps: list[float],
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    sink: int,
    window: int,
    repeats: int,
    seed: int,
    with_flex: bool,
    device: torch.device = CPU,
    dtype: torch.dtype = torch.float32,
    kernel: str = "auto",
    granularity: str = "query",
) -> dict[str, Any]:
    """Time stock sdpa, corelens' hybrid kernel (`kernel`) and compiled FlexAttention on one layer's attention.

    q, k, v are laid out as the model passes them (transposed views), so the kernels read what they read there.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(seed)
    q, k, v = (model_layout(1, h, tokens, head_dim, g, device, dtype) for h in (heads, kv_heads, kv_heads))
    scale = head_dim**-0.5
    stub = _stub(heads // kv_heads)
    fulls = {}
    for keep in keeps:
        full = torch.zeros(heads, dtype=torch.bool)
        full[choose_full(heads, keep, seed, _group(granularity, heads, kv_heads))] = True
        fulls[keep] = full

    def sdpa():
        return sdpa_attention_forward(stub, q, k, v, None, scaling=scale)[0]

    ran: dict[str, str] = {}

    def hybrid(keep):
        # The kernel itself, never the crossover's dense path: its times are what the crossover is measured from.
        y, ran[str(keep)], reason = prefill(
            kernel, q, k, v, None, fulls[keep], Pattern(sink, window), scale, dense_below=None
        )
        refuse_fallback(reason, f"kernel table N={tokens} F={keep}")
        return y

    def flexed(keep):
        return flex(q, k, v, None, fulls[keep], Pattern(sink, window), scale, compiled=True)

    out: dict[str, Any] = {
        "kernel": kernel,
        "layout": "model (transposed views of (batch, n, heads, dim))",
        "kernel_full_heads": {str(keep): fulls[keep].nonzero().flatten().tolist() for keep in keeps},
        "hybrid_kernel": ran,
        "sdpa_backend": sdpa_backend(sdpa),
        "plan_build_s": plan_seconds(
            kernel, fulls[keeps[0]], tokens, kv_heads, Pattern(sink, window), device
        ),
        # The streaming heads' path inside `blocked` on this device (band: the C++ kernel was built).
        "streaming_path": streaming_path(q.device, window, rows=tokens - sink - window),
    }
    # Warm-ups (the first flex call per mask compiles).
    sdpa()
    for keep in keeps:
        hybrid(keep)
    # The sdpa operator(s) the hybrid kernel's full heads ran, at the largest share: the baseline's own?
    out["hybrid_sdpa_backend"] = sdpa_backend(lambda: hybrid(max(keeps)))
    check_backends(out["sdpa_backend"], out["hybrid_sdpa_backend"], q.device)
    flex_ok = with_flex
    compile_s: dict[str, float] = {}
    diffs: dict[str, float] = {}
    if with_flex:
        try:
            for keep in keeps:
                seconds, y = _timed(lambda keep=keep: flexed(keep), device)
                compile_s[str(keep)] = seconds
                diffs[str(keep)] = float((y.float() - hybrid(keep).float()).abs().max())
                del y
        except Exception as err:  # recorded, never faked: the JSON says why there is no flex number
            flex_ok = False
            out["flex_error"] = (
                f"{type(err).__name__}: {str(err).strip().splitlines()[0][:500] if str(err) else ''}"
            )
    times: dict[str, list[float]] = {"sdpa": []}
    for keep in keeps:
        times[f"hybrid:{keep}"] = []
        if flex_ok:
            times[f"flex:{keep}"] = []
    before = compiles()  # a compile inside the timed repeats would be timed: counted, and printed
    for _ in range(repeats):
        times["sdpa"].append(_timed(sdpa, device)[0])
        for keep in keeps:
            times[f"hybrid:{keep}"].append(_timed(lambda keep=keep: hybrid(keep), device)[0])
            if flex_ok:
                times[f"flex:{keep}"].append(_timed(lambda keep=keep: flexed(keep), device)[0])
    out["compiles_timed"] = compiles() - before
    out["sdpa_s"] = statistics.median(times["sdpa"])
    out["times_s"] = times
    out["flex_compile_s"] = compile_s
    out["max_abs_diff_flex"] = diffs
    out["per_keep"] = {}
    for keep in keeps:
        f = float(fulls[keep].float().mean())
        kv_full = int(fulls[keep].view(kv_heads, -1).any(dim=-1).sum())
        row = {
            "full_fraction": f,
            "kv_full_fraction": kv_full / kv_heads,
            "hybrid_s": statistics.median(times[f"hybrid:{keep}"]),
            "ideal_speedup": ideal_speedup(tokens, f, sink, window),
        }
        row["speedup"] = paired(times["sdpa"], times[f"hybrid:{keep}"])
        row["of_ideal"] = row["speedup"] / row["ideal_speedup"]
        if flex_ok:
            row["flex_s"] = statistics.median(times[f"flex:{keep}"])
            row["flex_speedup"] = paired(times["sdpa"], times[f"flex:{keep}"])
            row["hybrid_over_flex"] = paired(times[f"flex:{keep}"], times[f"hybrid:{keep}"])
        out["per_keep"][str(keep)] = row
    return out


def prefill_flops(tokens: int, *, layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int,
                  full_heads: int | None, sink: int, window: int) -> float:  # fmt: skip
    """Return the multiply-add FLOPs of a decoder prefill; `full_heads` None = every head full (dense)."""
    head_dim = hidden // heads
    proj = 2 * tokens * hidden * (2 * heads * head_dim + 2 * kv_heads * head_dim)
    mlp = 2 * tokens * 3 * hidden * intermediate
    p_full, p_stream = pairs(tokens, sink, window)
    total_heads = layers * heads
    full = total_heads if full_heads is None else full_heads
    attention = 4 * head_dim * (full * p_full + (total_heads - full) * p_stream)
    return layers * (proj + mlp) + attention


def layer_kernel_seconds(
    tokens: int,
    sets: list[tuple[bool, ...]],
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    pattern: Pattern,
    repeats: int,
    seed: int,
    device: torch.device,
    dtype: torch.dtype,
    kernel: str,
) -> tuple[float, dict[tuple[bool, ...], float]]:
    """Return the benchmark's attention time of stock sdpa and of each head set in `sets` (one layer's full
    flags), as the kernel table measures it: random q, k, v in the model's layout at the timed length, one
    warm-up call, the median of `repeats` timed calls. The in-model times are held against these.

    A head set runs what the model's hook runs for it: stock sdpa when every head is full, else
    `kernels.prefill` with the default crossover.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(seed + 7)
    q, k, v = (model_layout(1, h, tokens, head_dim, g, device, dtype) for h in (heads, kv_heads, kv_heads))
    scale = head_dim**-0.5
    stub = _stub(heads // kv_heads)

    def sdpa():
        return sdpa_attention_forward(stub, q, k, v, None, scaling=scale)[0]

    def run(flags):
        if all(flags):  # the hook runs the stock call for an all-full layer
            return sdpa()
        y, _, reason = prefill(kernel, q, k, v, None, torch.tensor(flags), pattern, scale)
        refuse_fallback(reason, f"layer attention N={tokens}")
        return y

    calls = {"sdpa": sdpa, **{flags: (lambda flags=flags: run(flags)) for flags in sets}}
    times: dict[Any, list[float]] = {name: [] for name in calls}
    for fn in calls.values():
        fn()  # warm-up at the timed length (compiles what the timed calls run)
    for _ in range(repeats):
        for name, fn in calls.items():
            times[name].append(_timed(fn, device)[0])
    return statistics.median(times.pop("sdpa")), {flags: statistics.median(t) for flags, t in times.items()}


def _per_layer_median(runs: list[dict[int, float]]) -> dict[int, float]:
    """Return each layer's median over repeats of its attention seconds."""
    return {layer: statistics.median(run[layer] for run in runs) for layer in sorted(runs[0])}


def prefill_times(
    tokens: int,
    keeps: list[float],
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    sink: int,
    window: int,
    repeats: int,
    seed: int,
    device: torch.device = CPU,
    dtype: torch.dtype = torch.float32,
    adaptive: bool = False,
    kernel: str = "auto",
    granularity: str = "query",
    granularities: list[str] | None = None,
    warm_tokens: int | None = None,
) -> dict[str, Any]:
    """Time the whole-decoder prefill: stock sdpa against corelens hybrid attention, same weights and input.

    Every granularity of `granularities` (default: `granularity` alone) draws its own full heads at each kept
    share; the rows of `granularity` (or of the first) are `prefill_per_keep`, all rows
    `prefill_by_granularity[g][keep]`. The warm-up runs `warm_tokens` (default: the timed length on CUDA, so
    that every compiled kernel exists before the timed repeats; 256 on the CPU, where nothing compiles and a
    long warm-up would double the run). During the timed repeats the registered attention call of every
    layer is timed (`AttentionTimer`) and held against the same head set's kernel time from
    `layer_kernel_seconds`; `prefill_compiles_timed` counts the torch.compile frames compiled meanwhile.
    """
    from corelens.attention.prompt_context import AttentionContext, attention_context
    from corelens.attention.streaming import HybridPlan
    from corelens.policies import AdaptiveHybrid, HybridAttention

    granularities = list(granularities or [granularity])
    main = granularity if granularity in granularities else granularities[0]
    dims = Decoder(layers, hidden, heads, kv_heads, intermediate).dims()
    model = build_model(**dims, seed=seed, device=device, dtype=dtype)
    if warm_tokens is None:
        warm_tokens = tokens if device.type == "cuda" else min(tokens, 256)
    ids = make_input_ids(tokens, seed=seed).to(device)
    warm = make_input_ids(warm_tokens, seed=seed).to(device)
    if adaptive:
        # The adaptive signal reads the visual positions from the ids: give every variant the same image block.
        model.config.image_token_id = model.config.vocab_size - 1
        ids, warm = (with_visual_block(x, model.config.image_token_id) for x in (ids, warm))

    def label(g: str, keep: float) -> str:  # the main granularity keeps the plain names of earlier results
        return str(keep) if g == main else f"{g}:{keep}"

    policies = {}
    for g in granularities:
        for keep in keeps:
            chosen = choose_full(layers * heads, keep, seed, _group(g, heads, kv_heads))
            policies[label(g, keep)] = HybridPlan(tuple(divmod(i, heads) for i in chosen), sink, window)

    def stock(x):
        model.set_attn_implementation("sdpa")
        return model(input_ids=x, use_cache=False).last_hidden_state

    def fresh() -> None:
        if adaptive:  # each timed prefill builds its block mask, as a prompt of a new length would
            policy_block_mask.cache_clear()

    def hybrid_forward(x, name):
        fresh()
        model.set_attn_implementation("corelens")
        with HybridAttention.of(policies[name], kernel=kernel).applied(model) as on:
            y = model(input_ids=x, use_cache=False).last_hidden_state
        h = on.hooks[0].session
        refuse_fallback("; ".join(h.fallbacks), f"prefill {name}")
        return y, dict(h.stats)

    def adaptive_forward(x, name):
        fresh()
        model.set_attn_implementation("corelens")
        policy = policies[name]
        budget = policy.fraction(layers, heads)
        adaptive = AdaptiveHybrid(budget, policy.full, sink, window, kernel=kernel)
        # The signal reads the visual positions from the context: the image block of `with_visual_block`.
        visual = AttentionContext((x[0] == model.config.image_token_id).nonzero().flatten())
        with attention_context(visual), adaptive.applied(model) as on:
            y = model(input_ids=x, use_cache=False).last_hidden_state
        refuse_fallback("; ".join(on.hooks[0].session.fallbacks), f"adaptive prefill {name}")
        return y, dict(on.hooks[0].session.stats)

    runs = {f"hybrid:{name}": (hybrid_forward, name) for name in policies}
    if adaptive:
        runs.update({f"adaptive:{keep}": (adaptive_forward, str(keep)) for keep in keeps})
    stock(warm)
    for forward, name in runs.values():
        forward(warm, name)
    # The benchmark's kernel time of every layer's head set (and of stock sdpa), at the timed length.
    sets = {
        tuple(bool(x) for x in row.tolist()) for p in policies.values() for row in p.full_mask(layers, heads)
    }
    sdpa_kernel_s, set_kernel_s = layer_kernel_seconds(
        tokens, sorted(sets), heads=heads, kv_heads=kv_heads, head_dim=hidden // heads,
        pattern=Pattern(sink, window), repeats=repeats, seed=seed, device=device, dtype=dtype, kernel=kernel,
    )  # fmt: skip
    times: dict[str, list[float]] = {"sdpa": [], **{name: [] for name in runs}}
    attention: dict[str, list[dict[int, float]]] = {name: [] for name in times}
    stats = {}
    timer = AttentionTimer(device)
    before = compiles()
    with timer.timing():
        for _ in range(repeats):
            seconds, _ = _timed(lambda: stock(ids), device)
            times["sdpa"].append(seconds)
            attention["sdpa"].append(timer.collect())
            for name, (forward, policy) in runs.items():
                run = lambda forward=forward, policy=policy: forward(ids, policy)  # noqa: E731
                seconds, (_, stats[name]) = _timed(run, device)
                times[name].append(seconds)
                attention[name].append(timer.collect())
    head_dim = hidden // heads
    dense = prefill_flops(tokens, **dims, full_heads=None, sink=sink, window=window)
    sdpa_in_model = _per_layer_median(attention["sdpa"])
    out: dict[str, Any] = {
        "prefill_sdpa_s": statistics.median(times["sdpa"]),
        "prefill_times_s": times,
        "prefill_granularities": granularities,
        "prefill_warm_tokens": warm_tokens,
        "prefill_compiles_timed": compiles() - before,
        "sdpa_kernel_s": sdpa_kernel_s,
        "sdpa_attention_in_model_s": {str(i): s for i, s in sdpa_in_model.items()},
        "sdpa_in_model_over_kernel": {str(i): s / sdpa_kernel_s for i, s in sdpa_in_model.items()},
        "prefill_by_granularity": {g: {} for g in granularities},
    }
    for g in granularities:
        for keep in keeps:
            name = label(g, keep)
            policy = policies[name]
            n_full = len(policy.full)
            hybrid_flops = prefill_flops(tokens, **dims, full_heads=n_full, sink=sink, window=window)
            row = {
                "granularity": g,
                "asked_share": keep,
                "full_heads": n_full,
                "full_fraction": n_full / (layers * heads),
                "prefill_hybrid_s": statistics.median(times[f"hybrid:{name}"]),
                "prefill_flop_speedup": dense / hybrid_flops,
                "kernels_ran": stats[f"hybrid:{name}"],
            }
            # KV-cache bytes after this prefill: streaming KV heads keep S + W slots (plus an int64 slot table).
            stream_kv = int(policy.streaming_kv(layers, heads, kv_heads).sum())
            per_position = 2 * head_dim * torch.finfo(dtype).bits // 8  # K and V
            dense_bytes = layers * kv_heads * tokens * per_position
            kept = min(tokens, sink + window)
            saved = stream_kv * ((tokens - kept) * per_position - kept * 8) if tokens > sink + window else 0
            row.update(streaming_kv_heads=stream_kv, cache_dense_bytes=dense_bytes, cache_saved_bytes=saved)
            row.update(
                kv_full_fraction=1 - stream_kv / (layers * kv_heads),
                cache_kept_fraction=1 - saved / dense_bytes,
            )
            row["prefill_speedup"] = paired(times["sdpa"], times[f"hybrid:{name}"])
            row["prefill_vs_flops"] = row["prefill_speedup"] / row["prefill_flop_speedup"]
            # The registered attention call in the model against the kernel table's time for the same heads.
            in_model = _per_layer_median(attention[f"hybrid:{name}"])
            flags = [tuple(bool(x) for x in r.tolist()) for r in policy.full_mask(layers, heads)]
            bench = {i: set_kernel_s[flags[i]] for i in in_model}
            row["attention_in_model_s"] = {str(i): s for i, s in in_model.items()}
            row["attention_kernel_s"] = {str(i): s for i, s in bench.items()}
            ratios = {str(i): s / bench[i] for i, s in in_model.items()}
            row.update(in_model_over_kernel=ratios, in_model_over_kernel_max=max(ratios.values()))
            if adaptive and g == main:
                chosen = stats[f"adaptive:{keep}"].get("signal", 0)  # layers that measured a signal
                row.update(
                    prefill_adaptive_s=statistics.median(times[f"adaptive:{keep}"]),
                    adaptive_speedup=paired(times["sdpa"], times[f"adaptive:{keep}"]),
                    adaptive_over_fixed=paired(times[f"adaptive:{keep}"], times[f"hybrid:{name}"]),
                    adaptive_signal_layers=chosen,
                    adaptive_kernels_ran=stats[f"adaptive:{keep}"],
                    selection_scores_fraction=chosen * 16 * tokens / (layers * tokens * (tokens + 1) / 2),
                )
            out["prefill_by_granularity"][g][str(keep)] = row
    out["prefill_per_keep"] = out["prefill_by_granularity"][main]
    return out


def run_hybrid_benchmark(
    tokens: int,
    keeps: list[float],
    *,
    sink: int = 128,
    window: int = 1024,
    heads: int = 16,
    kv_heads: int = 2,
    hidden: int = 2048,
    intermediate: int = 5632,
    layers: int = 2,
    repeats: int = 1,
    seed: int = 0,
    with_flex: bool = True,
    with_prefill: bool = True,
    prefill_keeps: list[float] | None = None,
    threads: int | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    adaptive: bool = False,
    kernel: str = "auto",
    granularity: str = "query",
    prefill_granularities: list[str] | None = None,
) -> dict[str, Any]:
    """Run the kernel and prefill measurements; return the results (see the module docstring).

    `granularity` "kv" draws the full heads as whole KV heads (`keep` is then a share of KV heads); every
    row states the query heads full (`full_fraction`) and the KV heads full (`kv_full_fraction`).

    `prefill_keeps` limits the (slow) whole-decoder prefill to some of the kept fractions (default: all);
    `prefill_granularities` times the prefill at each of them ("query", "kv"; default: `granularity`).
    """
    prefill_keeps = list(prefill_keeps or keeps)
    import transformers

    threads = threads or cores()
    torch.set_num_threads(threads)
    head_dim = hidden // heads
    dev, dt = torch.device(device), getattr(torch, dtype)
    result: dict[str, Any] = {
        "tokens": tokens,
        "keeps": keeps,
        "kernel": kernel,
        "sink": sink,
        "window": window,
        "heads": heads,
        "kv_heads": kv_heads,
        "granularity": granularity,
        "head_dim": head_dim,
        "hidden": hidden,
        "intermediate": intermediate,
        "layers": layers,
        "repeats": repeats,
        "seed": seed,
        "threads": threads,
        "dtype": dtype,
        "device": device if dev.type != "cuda" else f"{device} ({torch.cuda.get_device_name(dev)})",
        "device_name": device_name(dev),  # what a crossover table measured here is keyed by
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "machine": machine(),
    }
    started = time.perf_counter()
    busy0, own0 = _busy_seconds(), _own_seconds()
    with torch.no_grad():
        result.update(
            kernel_times(
                tokens,
                keeps,
                heads=heads,
                kv_heads=kv_heads,
                head_dim=head_dim,
                sink=sink,
                window=window,
                repeats=repeats,
                seed=seed,
                with_flex=with_flex,
                device=dev,
                dtype=dt,
                kernel=kernel,
                granularity=granularity,
            )  # fmt: skip
        )
        if with_prefill:
            result.update(
                prefill_times(
                    tokens,
                    prefill_keeps,
                    layers=layers,
                    hidden=hidden,
                    heads=heads,
                    kv_heads=kv_heads,
                    intermediate=intermediate,
                    sink=sink,
                    window=window,
                    repeats=repeats,
                    seed=seed,
                    device=dev,
                    dtype=dt,
                    adaptive=adaptive,
                    kernel=kernel,
                    granularity=granularity,
                    granularities=prefill_granularities,
                )  # fmt: skip
            )
    # Top-level keys for the first kept fraction (the single-F form).
    first = result["per_keep"][str(keeps[0])]
    result["hybrid_s"] = first["hybrid_s"]
    result["ideal_speedup"] = first["ideal_speedup"]
    if "flex_s" in first:
        result["flex_s"] = first["flex_s"]
    else:
        result["flex_s"] = None
    if with_prefill:
        result["prefill_hybrid_s"] = result["prefill_per_keep"][str(prefill_keeps[0])]["prefill_hybrid_s"]
    result["wall_s"] = time.perf_counter() - started
    if busy0 is not None:
        # Cores used by other processes during the run, on average: the load this run competed with.
        other = (_busy_seconds() - busy0) - (_own_seconds() - own0)
        result["machine"]["other_processes_cores"] = round(max(0.0, other) / result["wall_s"], 3)
    with contextlib.suppress(OSError):
        result["machine"]["loadavg_end"] = os.getloadavg()
    return result


def summary(result: dict[str, Any]) -> str:
    """Return a few lines with the ratios of a result."""
    lines = [
        f"hybrid bench N={result['tokens']} S={result['sink']} W={result['window']} kernel={result.get('kernel', 'auto')}:"
        f" sdpa {result['sdpa_s']:.3f}s ({result.get('sdpa_backend', '?')}); plan build {result.get('plan_build_s', {})}",
        f"  sdpa operator(s) of the hybrid kernel's full heads at F={max(result['keeps'])}:"
        f" {result.get('hybrid_sdpa_backend', '?')}",
    ]
    nan = float("nan")  # results written before KV-head counts
    for keep, row in result["per_keep"].items():
        line = (
            f"  F={keep} (f={row['full_fraction']:.3f}, KV heads full {row.get('kv_full_fraction', nan):.3f}):"
            f" hybrid {row['hybrid_s']:.3f}s speed-up {row['speedup']:.2f}x / ideal {row['ideal_speedup']:.2f}x = {row['of_ideal']:.0%}"
        )
        if "flex_s" in row:
            line += f" | flex {row['flex_s']:.3f}s, hybrid {row['hybrid_over_flex']:.2f}x faster"
        pre = result.get("prefill_per_keep", {}).get(keep)
        if pre:
            line += (
                f" | prefill {pre['prefill_speedup']:.2f}x vs FLOPs {pre['prefill_flop_speedup']:.2f}x"
                f" ({pre['prefill_vs_flops']:.0%})"
            )
        if pre and "prefill_adaptive_s" in pre:
            line += f" | adaptive {pre['adaptive_speedup']:.2f}x, {pre['adaptive_over_fixed']:.3f}x the fixed set's time"
        lines.append(line)
    if result.get("flex_error"):
        lines.append(f"  flex: {result['flex_error']}")
    lines += _prefill_lines(result)
    return "\n".join(lines)


def _ratios(per_layer: dict[str, float]) -> str:
    return " ".join(f"L{layer} {ratio:.2f}x" for layer, ratio in per_layer.items())


def _prefill_lines(result: dict[str, Any]) -> list[str]:
    """Return the summary lines of the prefill at each granularity, in-model attention and compile counts."""
    lines = []
    for g, rows in result.get("prefill_by_granularity", {}).items():
        for keep, pre in rows.items():
            lines.append(
                f"  prefill {g} F={keep}: query heads full {pre['full_fraction']:.3f}, KV heads full"
                f" {pre['kv_full_fraction']:.3f}, KV cache kept {pre['cache_kept_fraction']:.3f} | prefill"
                f" {pre['prefill_speedup']:.2f}x vs FLOPs {pre['prefill_flop_speedup']:.2f}x ({pre['prefill_vs_flops']:.0%})"
                f" | attention in model / kernel: {_ratios(pre['in_model_over_kernel'])}"
            )
    if "sdpa_in_model_over_kernel" in result:
        lines.append(
            f"  stock sdpa attention in model / kernel: {_ratios(result['sdpa_in_model_over_kernel'])}"
        )
    counts = [f"{what} {result[key]}" for what, key in (("kernels", "compiles_timed"),
              ("prefill", "prefill_compiles_timed")) if key in result]  # fmt: skip
    if counts:
        lines.append(f"  torch.compile frames compiled during the timed repeats: {', '.join(counts)}")
    return lines


def table(results: list[dict[str, Any]]) -> str:
    """Return the README's markdown table (one row per N and kept fraction) from benchmark results."""
    head = (
        "| N | F | f | sdpa s | hybrid s | speed-up | ideal | % of ideal | flex s | hybrid vs flex "
        "| prefill sdpa s | prefill hybrid s | prefill speed-up | FLOP-predicted | measured / predicted |"
    )
    lines = [head, "|" + " ---: |" * 15]
    for r in sorted(results, key=lambda r: r["tokens"]):
        for keep, row in r["per_keep"].items():
            pre = r.get("prefill_per_keep", {}).get(keep, {})
            flex_s = f"{row['flex_s']:.3g}" if "flex_s" in row else "—"
            vs_flex = f"{row['hybrid_over_flex']:.2f}×" if "hybrid_over_flex" in row else "—"
            cells = [
                _tokens(r["tokens"]), f"{float(keep):.0%}", f"{row['full_fraction']:.3f}", f"{r['sdpa_s']:.3g}",
                f"{row['hybrid_s']:.3g}", f"{row['speedup']:.2f}×", f"{row['ideal_speedup']:.2f}×",
                f"{row['of_ideal']:.0%}", flex_s, vs_flex,
                f"{r['prefill_sdpa_s']:.3g}" if pre else "—", f"{pre['prefill_hybrid_s']:.3g}" if pre else "—",
                f"{pre['prefill_speedup']:.2f}×" if pre else "—", f"{pre['prefill_flop_speedup']:.2f}×" if pre else "—",
                f"{pre['prefill_vs_flops']:.0%}" if pre else "—",
            ]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    adaptive = [(r, k, pre) for r in results for k, pre in r.get("prefill_per_keep", {}).items()
                if "prefill_adaptive_s" in pre]  # fmt: skip
    if adaptive:
        lines += ["", "| N | F | prefill sdpa s | fixed s | adaptive s | fixed speed-up | adaptive speed-up "
                  "| adaptive / fixed time | selection scores / prefill scores |", "|" + " ---: |" * 9]  # fmt: skip
        for r, keep, pre in sorted(adaptive, key=lambda x: (x[0]["tokens"], float(x[1]))):
            cells = [
                _tokens(r["tokens"]), f"{float(keep):.0%}", f"{r['prefill_sdpa_s']:.3g}",
                f"{pre['prefill_hybrid_s']:.3g}", f"{pre['prefill_adaptive_s']:.3g}", f"{pre['prefill_speedup']:.2f}×",
                f"{pre['adaptive_speedup']:.2f}×", f"{pre['adaptive_over_fixed']:.3f}×",
                f"{pre['selection_scores_fraction']:.2%}",
            ]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def prefill_table(results: list[dict[str, Any]]) -> str:
    """Return the markdown table of the prefill at each granularity (empty for results without one): asked and
    effective shares, KV-cache bytes kept, the speed-up against the FLOP prediction, and the in-model
    attention against the kernel table's time for the same heads."""
    rows = [(r, g, keep, pre) for r in results for g, by_keep in r.get("prefill_by_granularity", {}).items()
            for keep, pre in by_keep.items()]  # fmt: skip
    if not rows:
        return ""
    lines = ["| N | granularity | F asked | query heads full | KV heads full | KV-cache bytes kept "
             "| prefill sdpa s | prefill hybrid s | prefill speed-up | FLOP-predicted | measured / predicted "
             "| in-model / kernel attention (max over layers) | sdpa in-model / kernel |", "|" + " ---: |" * 13]  # fmt: skip
    for r, g, keep, pre in sorted(rows, key=lambda x: (x[0]["tokens"], x[1], float(x[2]))):
        sdpa = r.get("sdpa_in_model_over_kernel", {})
        n = _tokens(r["tokens"])
        cells = [
            n, g, f"{float(keep):.0%}", f"{pre['full_fraction']:.3f}",
            f"{pre['kv_full_fraction']:.3f}", f"{pre['cache_kept_fraction']:.3f}", f"{r['prefill_sdpa_s']:.3g}",
            f"{pre['prefill_hybrid_s']:.3g}", f"{pre['prefill_speedup']:.2f}×", f"{pre['prefill_flop_speedup']:.2f}×",
            f"{pre['prefill_vs_flops']:.0%}", f"{pre['in_model_over_kernel_max']:.2f}×",
            f"{max(sdpa.values()):.2f}×" if sdpa else "—",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fractions(text: str) -> list[float]:
    """Return the kept fractions of "0.05,10%,0.2" as floats: shares of the heads, read as `corelens hybrid
    --keep` reads them (a count such as 8 is refused: the benchmark's keys are shares)."""
    values = [k_value(k) for k in parse_k(text)]
    counts = [v for v in values if isinstance(v, int)]
    if counts:
        raise OptionError(f"expected shares of the heads (5% or 0.05), got the count(s) {counts}")
    return values
