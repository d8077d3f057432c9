"""Decoding benchmark: tokens/s and KV-cache bytes, stock dense cache against hybrid's trimmed cache.

A random-weight Qwen2.5-VL text decoder (`corelens.bench.synthetic.build_model`, default 4 layers of width 2048,
16 query heads over 2 KV heads) reads an N-token random prompt and then decodes `steps` tokens one at a time,
batch 1, under `torch.no_grad()`, the next token's id given (random, the same for both sides: the decoder has
no head to choose one):

- ``dense``: transformers' "sdpa" attention with its `DynamicCache` (every KV head keeps every position);
- ``hybrid``: `HybridAttention(full, decode="stream")` applied, with its session's `cache()`: the streaming KV heads keep S
  sinks + a window of W, the full ones every position. The policy keeps a share F full (seeded random): with
  ``granularity="kv"`` round(F L H_kv) KV heads and all their query heads, so every other KV head is trimmed;
  with ``"query"`` round(F L H) query heads, and a KV head is trimmed only when all its query heads stream.

Each side: one warm-up at the timed length (prefill + steps at N: every shape the timed runs meet, the trimmed
cache's past S + W included, is built before timing), then `repeats` (>= 3 on a GPU run) runs of prefill + steps at N,
interleaved, both sides under the same pinned sdpa backends (`pinned_backends`), whose operators of one step
are recorded per side (`sdpa_backend`) and must agree; decode time is the median over runs of the steps' wall time (after a device synchronisation),
the prefill untimed. KV bytes are the cache's after the last step (`HybridCache.report` for the hybrid side,
whose ``dense_bytes`` is what a `DynamicCache` holds for the same positions).

Run as ``corelens bench decode --tokens N --keep 0.2 --steps 64 --json FILE``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from corelens.bench.hybrid_kernels import refuse_fallback
from corelens.bench.synthetic import Decoder, build_model, machine_info, make_input_ids, sync
from corelens.errors import CorelensError

GRANULARITIES = ("kv", "query")


def full_heads(layers: int, heads: int, kv_heads: int, keep: float, granularity: str, seed: int):
    """Return the (layer, query head) pairs kept full: a seeded random share `keep` of KV or query heads."""
    groups = heads // kv_heads
    units = layers * (kv_heads if granularity == "kv" else heads)
    count = max(0, min(units, round(keep * units)))
    chosen = torch.randperm(units, generator=torch.Generator().manual_seed(seed))[:count].tolist()
    if granularity == "query":
        return [(u // heads, u % heads) for u in chosen]
    per_layer = kv_heads
    return [(u // per_layer, (u % per_layer) * groups + g) for u in chosen for g in range(groups)]


def _cache_bytes(cache) -> int:
    """Return the bytes a transformers cache holds (keys and values of every layer)."""
    return sum(
        t.numel() * t.element_size()
        for layer in cache.layers
        for t in (layer.keys, layer.values)
        if t is not None
    )


def pinned_backends(device: torch.device) -> list:
    """Return the sdpa backends both sides decode under (`torch.nn.attention.sdpa_kernel`), in priority order.

    CUDA: flash first (unmasked calls: the stock decode and the hybrid's full heads of an unpadded prompt),
    then memory-efficient (the masked streaming slots; flash takes no mask), never cuDNN, whose graph may be
    rebuilt at every new key length (a stock side paying that would flatter the hybrid). CPU: flash for CPU,
    then math.
    """
    from torch.nn.attention import SDPBackend

    if device.type == "cuda":
        return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    return [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]


def _decode(model, ids: torch.Tensor, steps: torch.Tensor, device: torch.device, cache, backends=None):
    """Prefill `ids` into `cache`, then feed `steps` one token at a time under the sdpa `backends` (None: sdpa's
    choice); return the decoding seconds, or with `backends` the sdpa operators of the last step."""
    from torch.nn.attention import sdpa_kernel

    model(input_ids=ids, cache=cache, use_cache=True)
    sync(device)
    start = time.perf_counter()
    with sdpa_kernel(backends or pinned_backends(device), set_priority=True):
        for t in range(steps.shape[1] - (1 if backends else 0)):
            model(input_ids=steps[:, t : t + 1], cache=cache, use_cache=True)
        sync(device)
        seconds = time.perf_counter() - start
        if backends:
            from corelens.bench.hybrid_kernels import sdpa_backend

            return sdpa_backend(lambda: model(input_ids=steps[:, -1:], cache=cache, use_cache=True))
    return seconds


def run_decode_benchmark(
    tokens: int,
    *,
    keep: float = 0.2,
    granularity: str = "kv",
    steps: int = 64,
    sink: int = 128,
    window: int = 1024,
    layers: int = 4,
    hidden: int = 2048,
    heads: int = 16,
    kv_heads: int = 2,
    intermediate: int = 5632,
    vocab_size: int = 1024,
    kernel: str = "auto",
    repeats: int = 3,
    seed: int = 0,
    device: str = "cpu",
    dtype: str = "float32",
) -> dict[str, Any]:
    """Time `steps` decoding steps after an N-token prompt, dense against hybrid; return the results dict."""
    import transformers
    from transformers import DynamicCache

    from corelens.policies import HybridAttention

    dev = torch.device(device)
    pairs = full_heads(layers, heads, kv_heads, keep, granularity, seed)
    dims = Decoder(layers, hidden, heads, kv_heads, intermediate).dims()
    times: dict[str, list[float]] = {"dense": [], "hybrid": []}
    with torch.no_grad():
        model = build_model(**dims, vocab_size=vocab_size, seed=seed, device=device, dtype=dtype)
        ids = make_input_ids(tokens + steps, vocab_size, seed).to(dev)

        def dense(n, backends=None):
            model.set_attn_implementation("sdpa")
            cache = DynamicCache(config=model.config)
            return _decode(model, ids[:, :n], ids[:, n : n + steps], dev, cache, backends), cache

        def hybrid(n, backends=None):
            model.set_attn_implementation("corelens")
            policy = HybridAttention(tuple(pairs), sink, window, decode="stream", kernel=kernel)
            with policy.applied(model) as on:
                h = on.hooks[0].session
                cache = h.cache()
                return _decode(model, ids[:, :n], ids[:, n : n + steps], dev, cache, backends), (cache, h)

        for run in (dense, hybrid):  # warm-up at the timed length: the trimmed shapes (N > S + W) seen once
            run(tokens)
        for _ in range(repeats):
            seconds, dense_cache = dense(tokens)
            times["dense"].append(seconds)
            seconds, (cache, session) = hybrid(tokens)
            times["hybrid"].append(seconds)
        report = cache.report()
        stats = dict(session.stats)
        refuse_fallback("; ".join(session.fallbacks), f"decode N={tokens}")
        dense_bytes = _cache_bytes(dense_cache)
        # The sdpa operators of one decoding step on each side, under the same pinned backends: the stock
        # step's must be among the hybrid's (its full heads), or the two sides ran different kernels ("none":
        # no sdpa call on the hybrid side, below S + W, nothing to compare).
        pins = pinned_backends(dev)
        backends = {"dense": dense(tokens, pins)[0], "hybrid": hybrid(tokens, pins)[0]}
        hybrid_ops = set(backends["hybrid"].split(", "))
        if "none" not in hybrid_ops and not set(backends["dense"].split(", ")) <= hybrid_ops:
            raise CorelensError(
                f"decode N={tokens}: stock decoding ran sdpa as {backends['dense']}, the hybrid's full heads as "
                f"{backends['hybrid']}: the benchmark needs one backend for both"
            )

    out: dict[str, Any] = {
        "tokens": tokens,
        "steps": steps,
        **dims,
        "keep": keep,
        "granularity": granularity,
        "full_query_heads": len(pairs),
        "trimmed_kv_heads": sum(len(layer.stream_kv) for layer in cache.layers),
        "sink": sink,
        "window": window,
        "repeats": repeats,
        "seed": seed,
        "device": device,
        "dtype": dtype,
        "sdpa_backends_pinned": [b.name for b in pinned_backends(dev)],
        "sdpa_backend": backends,
    }
    for side in times:
        out[f"{side}_decode_s"] = statistics.median(times[side])
        out[f"{side}_tokens_per_s"] = steps / out[f"{side}_decode_s"]
        out[f"{side}_times_s"] = times[side]
    # The asked share (`keep`, of `granularity` units) against the effective ones.
    out["full_fraction"] = len(pairs) / (layers * heads)
    out["kv_full_fraction"] = 1 - out["trimmed_kv_heads"] / (layers * kv_heads)
    out["decode_speedup"] = out["dense_decode_s"] / out["hybrid_decode_s"]
    out["dense_kv_bytes"] = dense_bytes
    out["hybrid_kv_bytes"] = report["hybrid_bytes"]
    out["hybrid_dense_equivalent_bytes"] = report["dense_bytes"]
    out["kv_bytes_ratio"] = report["hybrid_bytes"] / dense_bytes
    # The full KV heads' preallocated decoding buffer past the positions held (`kernels.cache.CHUNK`).
    out["hybrid_reserved_kv_bytes"] = report["reserved_bytes"]
    out["hybrid_stats"] = stats
    out["torch"] = torch.__version__
    out["transformers"] = transformers.__version__
    out["machine"] = machine_info()
    if dev.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(dev)
    return out


def summary(result: dict[str, Any]) -> str:
    """Return a one-line summary of a decode benchmark result."""
    return (
        f"decode bench N={result['tokens']} +{result['steps']} L={result['layers']} "
        f"F={result['keep']:.0%} ({result['granularity']}; query heads full {result['full_fraction']:.3f}, KV heads "
        f"full {result['kv_full_fraction']:.3f}): dense {result['dense_tokens_per_s']:.1f} tok/s "
        f"{result['dense_kv_bytes'] / 2**20:.1f} MiB | hybrid {result['hybrid_tokens_per_s']:.1f} tok/s "
        f"{result['hybrid_kv_bytes'] / 2**20:.1f} MiB | speed-up {result['decode_speedup']:.2f}x, "
        f"KV bytes {result['kv_bytes_ratio']:.3f}x; sdpa: dense {result['sdpa_backend']['dense']}, hybrid "
        f"{result['sdpa_backend']['hybrid']}"
    )
