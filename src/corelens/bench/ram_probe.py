"""RAM-probe benchmark: time and peak memory of the RAM probe against plain sdpa and eager attention.

A random-weight Qwen2.5-VL text decoder of realistic width (default: 4 layers, hidden 2048, 16 query heads,
2 key/value heads, head_dim 128, intermediate 5632, vocab 1024) runs fp32, batch 1, under `torch.no_grad()`
on an N-token random prompt, in three variants with the same weights and inputs:

- ``sdpa``: transformers' "sdpa" attention, plain forward;
- ``probe``: the corelens attention function with a `RamProbe` active on every layer (the last
  `query_rows` positions as query rows; Omega = about `target_tokens` contiguous positions in the middle of
  a "visual" span that leaves 64 positions of text on either side);
- ``eager``: transformers' "eager" attention with ``output_attentions=True`` (every layer's N x N
  attention weights are kept), skipped where it would not fit (see `estimate_eager_peak_mb`).

Time: one warm-up forward per variant at the timed length (the stock side's backend builds its graphs for N
there, not in a timed repeat), then the median of `repeats` forwards per
variant, interleaved (sdpa, probe, eager, sdpa, probe, ...) so drift affects all alike.

Peak memory: each variant runs once more in a fresh Python process (weights re-created from the same
seed) where "peak" is the activation memory of the forward, i.e. the largest increase of the process RSS
over its value just before the forward (`corelens.bench.memory.PeakRSS`, sampled about every 1 ms); the
child's lifetime ``ru_maxrss`` (weights and interpreter included) is reported next to it.

Run as ``corelens bench ram --tokens N --json FILE [--no-eager]``.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from corelens.bench.synthetic import Decoder, build_model, cores, machine_info, make_input_ids, sync

MB = 1 << 20
GB = 1 << 30
VARIANTS = ("sdpa", "probe", "eager")
EAGER_MAX_TOKENS = 16384
EAGER_MAX_BYTES = 18 * GB
WARMUP_TOKENS = 128
_CHILD_FLAG = "--_memory-child"


def probe_sets(tokens: int, target_tokens: int, query_rows: int) -> dict[str, torch.Tensor]:
    """Return the probe's query rows (last positions), visual span and Omega (middle of the visual span)."""
    margin = min(64, tokens // 8)
    visual = torch.arange(margin, tokens - margin)
    size = max(1, min(target_tokens, len(visual) // 2))
    start = margin + (len(visual) - size) // 2
    omega = torch.arange(start, start + size)
    rows = torch.arange(max(0, tokens - query_rows), tokens)
    return {"rows": rows, "omega": omega, "visual": visual}


def estimate_eager_peak_mb(tokens: int, decoder: Decoder, vocab_size: int = 1024) -> float:
    """Estimate the absolute peak RSS (MiB) of the eager forward with ``output_attentions=True``.

    The attention weights of the finished layers are kept (heads x N x N fp32 each) and the running layer
    briefly holds two such tensors (scores and their softmax), so weights take (layers + 1) of them; add
    the float causal mask (N x N), the weights and about ten N x hidden-sized activations.
    """
    d = decoder
    head_dim = d.hidden // d.heads
    per_layer = 2 * d.hidden * (d.heads + d.kv_heads) * head_dim + 3 * d.hidden * d.intermediate
    params = d.layers * per_layer + vocab_size * d.hidden
    attn = d.heads * tokens * tokens * 4
    acts = tokens * (3 * d.intermediate + 6 * d.hidden) * 4
    return (
        (d.layers + 1) * attn + tokens * tokens * 4 + params * 4 + acts
    ) / MB + 600  # + interpreter, torch


def _mem_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _attention_modules(model: torch.nn.Module) -> list[tuple[int, torch.nn.Module]]:
    from corelens.models.loaded import decoder_attention_modules

    return list(enumerate(decoder_attention_modules(model)))


def _forward(model: torch.nn.Module, variant: str, input_ids: torch.Tensor, spec: dict[str, Any]) -> dict:
    """Run one forward of `variant`; return its hidden states and, for probe/eager, what they measured."""
    from corelens.attention import RamProbe, activate

    tokens = input_ids.shape[1]
    if variant == "sdpa":
        out = model(input_ids=input_ids, use_cache=False)
        return {"hidden": out.last_hidden_state}
    if variant == "probe":
        sets = probe_sets(tokens, spec["target_tokens"], spec["query_rows"])
        probe = RamProbe(spec["layers"], spec["heads"], sets["rows"], sets["omega"], sets["visual"], tokens)
        with activate(_attention_modules(model), probe):
            out = model(input_ids=input_ids, use_cache=False)
        return {"hidden": out.last_hidden_state, "mass": probe.mass, "visual_mass": probe.visual_mass}
    if variant == "eager":
        out = model(input_ids=input_ids, use_cache=False, output_attentions=True)
        return {"hidden": out.last_hidden_state, "attentions": out.attentions}
    raise ValueError(f"unknown variant {variant!r}")


_IMPLEMENTATION = {"sdpa": "sdpa", "probe": "corelens", "eager": "eager"}


def _use(model: torch.nn.Module, variant: str) -> None:
    name = _IMPLEMENTATION[variant]
    if model.config._attn_implementation != name:
        model.set_attn_implementation(name)


def _trim_heap() -> None:
    """Return freed heap memory to the OS (glibc), so a following RSS baseline holds only live memory."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _model_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    keys = ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab_size", "seed", "device", "dtype")
    return {k: spec[k] for k in keys}


def _memory_child(spec: dict[str, Any]) -> dict[str, float]:
    """In a fresh process: build the model, warm up, and measure one forward's peak RSS increase."""
    from corelens.bench.memory import PeakRSS, max_rss_mb

    torch.set_num_threads(spec["threads"])
    variant = spec["variant"]
    device = spec["device"]
    with torch.no_grad():
        model = build_model(**_model_kwargs(spec), attn_implementation=_IMPLEMENTATION[variant])
        input_ids = make_input_ids(spec["tokens"], spec["vocab_size"], spec["seed"]).to(device)
        warm = make_input_ids(min(WARMUP_TOKENS, spec["tokens"]), spec["vocab_size"], spec["seed"]).to(device)
        del _forward(model, variant, warm, spec)["hidden"]
        _trim_heap()
        if torch.device(device).type == "cuda":
            # On a GPU the activations live in device memory: the allocator's peak above what is held.
            sync(device)
            held = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            result = _forward(model, variant, input_ids, spec)
            sync(device)
            peak_mb = (torch.cuda.max_memory_allocated(device) - held) / MB
            del result
            return {"peak_mb": peak_mb, "baseline_mb": held / MB, "peak_rss_mb": None, "maxrss_mb": None,
                    "samples": 1}  # fmt: skip
        with PeakRSS() as peak:
            result = _forward(model, variant, input_ids, spec)
        del result
    return {
        "peak_mb": peak.peak_mb,
        "baseline_mb": peak.baseline_mb,
        "peak_rss_mb": peak.peak_rss_mb,
        "maxrss_mb": max_rss_mb(),
        "samples": peak.samples,
    }


def measure_memory(variant: str, spec: dict[str, Any]) -> dict[str, float]:
    """Measure one variant's forward peak memory in a fresh Python process (same seed, same weights)."""
    src = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    payload = json.dumps({**spec, "variant": variant})
    cmd = [sys.executable, "-m", "corelens.bench.ram_probe", _CHILD_FLAG, payload]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"memory measurement of {variant!r} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _eager_mass(
    attentions: tuple[torch.Tensor, ...], sets: dict[str, torch.Tensor], key: str
) -> torch.Tensor:
    """Return per layer and head the mean mass of the probe rows on a token set, from eager weights."""
    rows, tokens = sets["rows"], sets[key]
    return torch.stack([a[0][:, rows][:, :, tokens].double().sum(-1).mean(-1) for a in attentions]).float()


def run_ram_benchmark(
    tokens: int,
    *,
    layers: int = 4,
    hidden: int = 2048,
    heads: int = 16,
    kv_heads: int = 2,
    intermediate: int = 5632,
    target_tokens: int = 1024,
    query_rows: int = 32,
    eager: bool | None = None,
    seed: int = 0,
    repeats: int | None = None,
    vocab_size: int = 1024,
    device: str = "cpu",
    dtype: str = "float32",
) -> dict[str, Any]:
    """Time and measure peak memory of the sdpa, RAM-probe and eager forwards; return the results dict."""
    import transformers

    from corelens.attention.probes import chunk_bytes, rows_per_chunk

    threads = cores()
    torch.set_num_threads(threads)
    if repeats is None:
        repeats = 3 if tokens <= 8192 or torch.device(device).type == "cuda" else 1
    decoder = Decoder(layers, hidden, heads, kv_heads, intermediate)
    dims = decoder.dims()
    estimate = estimate_eager_peak_mb(tokens, decoder, vocab_size)
    skipped = None
    if eager is None:
        available = _mem_available_bytes()
        limit = min(EAGER_MAX_BYTES, int(0.9 * available)) if available else EAGER_MAX_BYTES
        if tokens > EAGER_MAX_TOKENS:
            skipped = f"tokens > {EAGER_MAX_TOKENS}"
        elif estimate * MB > limit:
            skipped = f"estimated peak {estimate / 1024:.1f} GiB > limit {limit / GB:.1f} GiB"
        eager = skipped is None
    elif not eager:
        skipped = "disabled"
    variants = [v for v in VARIANTS if v != "eager" or eager]
    spec = {
        "tokens": tokens,
        **dims,
        "vocab_size": vocab_size,
        "seed": seed,
        "target_tokens": target_tokens,
        "query_rows": query_rows,
        "threads": threads,
        "device": device,
        "dtype": dtype,
    }

    # Peak memory: one fresh process per variant, before this process holds a model of its own.
    memory = {v: measure_memory(v, spec) for v in variants}

    # Time: one model, switched between attention implementations; interleaved repeats.
    times: dict[str, list[float]] = {v: [] for v in variants}
    check: dict[str, float | None] = {"probe_check": None, "probe_check_visual": None}
    with torch.no_grad():
        model = build_model(**dims, vocab_size=vocab_size, seed=seed, device=device, dtype=dtype)
        input_ids = make_input_ids(tokens, vocab_size, seed).to(device)
        for v in variants:  # warm-up at the timed length: no graph build / allocation of N is timed
            _use(model, v)
            _forward(model, v, input_ids, spec)
        reference: dict[str, torch.Tensor] = {}
        for _ in range(repeats):
            for v in variants:
                _use(model, v)
                sync(device)
                start = time.perf_counter()
                result = _forward(model, v, input_ids, spec)
                sync(device)
                times[v].append(time.perf_counter() - start)
                if v == "sdpa" and "sdpa" not in reference:
                    reference["sdpa"] = result["hidden"]
                elif v == "probe" and "mass" not in reference:
                    reference["mass"], reference["visual_mass"] = result["mass"], result["visual_mass"]
                    check["probe_output_max_abs_diff"] = float(
                        (result["hidden"].float() - reference["sdpa"].float()).abs().max()
                    )
                elif v == "eager" and check["probe_check"] is None:
                    sets = probe_sets(tokens, target_tokens, query_rows)
                    for key, name in (("omega", "probe_check"), ("visual", "probe_check_visual")):
                        ref = _eager_mass(result["attentions"], sets, key).cpu()
                        mass = reference["mass" if key == "omega" else "visual_mass"]
                        check[name] = float((ref - mass).abs().max())
                del result
                gc.collect()
        del model, reference

    sets = probe_sets(tokens, target_tokens, query_rows)
    out: dict[str, Any] = {
        "tokens": tokens,
        **dims,
        "head_dim": hidden // heads,
        "vocab_size": vocab_size,
        "target_tokens": target_tokens,
        "omega_tokens": len(sets["omega"]),
        "visual_tokens": len(sets["visual"]),
        "query_rows": query_rows,
        "repeats": repeats,
        "seed": seed,
        "device": device,
        "dtype": dtype,
    }
    for v in variants:
        out[f"{v}_s"] = statistics.median(times[v])
        out[f"{v}_times_s"] = times[v]
    for v in variants:
        out[f"{v}_peak_mb"] = memory[v]["peak_mb"]
        out[f"{v}_maxrss_mb"] = memory[v]["maxrss_mb"]
        out[f"{v}_baseline_mb"] = memory[v]["baseline_mb"]
    # How the probe cut its rows here (`probes.chunk_bytes`: on CUDA it depends on the free memory).
    out["probe_rows_per_chunk"] = rows_per_chunk(heads, tokens, chunk_bytes(torch.device(device)))
    out["probe_time_ratio"] = out["probe_s"] / out["sdpa_s"]
    out["probe_mem_ratio"] = out["probe_peak_mb"] / out["sdpa_peak_mb"]
    out["eager_mem_over_probe"] = out["eager_peak_mb"] / out["probe_peak_mb"] if eager else None
    out["eager_estimate_mb"] = estimate
    out["eager_skipped"] = skipped
    out.update(check)
    out["torch"] = torch.__version__
    out["transformers"] = transformers.__version__
    out["threads"] = threads
    out["machine"] = machine_info()
    return out


def summary(result: dict[str, Any]) -> str:
    """Return a one-line summary of a benchmark result with its ratios."""
    line = (
        f"ram bench N={result['tokens']} L={result['layers']}: sdpa {result['sdpa_s']:.2f}s "
        f"{result['sdpa_peak_mb']:.0f}MB | probe {result['probe_s']:.2f}s {result['probe_peak_mb']:.0f}MB "
        f"| probe/sdpa time {result['probe_time_ratio']:.3f}x mem {result['probe_mem_ratio']:.3f}x"
    )
    if "eager_s" in result:
        line += (
            f" | eager {result['eager_s']:.2f}s {result['eager_peak_mb']:.0f}MB, eager/probe mem "
            f"{result['eager_mem_over_probe']:.1f}x, probe_check {result['probe_check']:.2e}"
        )
    else:
        line += f" | eager skipped ({result['eager_skipped']})"
    return line


if __name__ == "__main__" and sys.argv[1:2] == [_CHILD_FLAG]:
    # The child process of `measure_memory` (not a user's command: users run `corelens bench ram`).
    print(json.dumps(_memory_child(json.loads(sys.argv[2]))))
