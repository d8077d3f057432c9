"""GPU checks of the batched RAM probe and of trimmed-cache decoding (issue 28, points 2 and 3).

1. The probe's batched rows (one chunk) equal its rows one at a time, on the device, in bf16, GQA, at N keys;
   with CUDA's sync debug mode set to "warn", one layer's `pre` synchronises exactly once (the final copy).
2. Decoding with the trimmed cache equals the dense rule (`kernel="reference"`, a DynamicCache) token by token
   on a random-weight decoder, and the cache write and the trimmed kernel of a step never synchronise.

Run as `python3 -m corelens.bench.probe_decode [--device cuda] [--tokens 8192]` (or benchmarks/gpu_probe_decode.py);
on the CPU it runs the parity checks only (the sync checks need CUDA's sync debug mode; tests/ checks the CPU path by patching).
A check past its stated tolerance prints FAIL and the command exits 1.
"""

from __future__ import annotations

import argparse
import sys
import warnings

import torch
from transformers import DynamicCache

from corelens.attention import probes
from corelens.attention.dispatch import AttentionCall
from corelens.attention.kernels.cache import HybridCacheLayer
from corelens.attention.probes import RamProbe
from corelens.attention.streaming import HybridHook
from corelens.bench.synthetic import build_model, make_input_ids
from corelens.policies import HybridAttention


def synchronisations(device: torch.device, fn, *args, **kwargs) -> tuple[int, object]:
    """Return how many synchronising CUDA calls `fn` made (sync debug mode "warn"), and its result."""
    if device.type != "cuda":
        return -1, fn(*args, **kwargs)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = fn(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in seen), result


def probe_check(device: torch.device, tokens: int) -> bool:
    """Print the batched probe against its rows one at a time; return whether they agree (1e-5)."""
    g = torch.Generator(device=device).manual_seed(0)
    heads, kv_heads, dim = 28, 4, 128
    query = torch.randn(1, heads, tokens, dim, device=device, generator=g, dtype=torch.bfloat16)
    key = torch.randn(1, kv_heads, tokens, dim, device=device, generator=g, dtype=torch.bfloat16)
    call = AttentionCall(None, 0, query, key, key, None, dim**-0.5)
    rows, omega, visual = (
        torch.arange(tokens - 32, tokens),
        torch.arange(tokens // 8, tokens // 4),
        torch.arange(64, tokens - 64),
    )
    masses = {}
    for name, budget in (("batched", None), ("row by row", 4 * heads * tokens)):
        original = probes.chunk_bytes
        if budget:
            probes.chunk_bytes = lambda device, budget=budget: budget
        try:
            probe = RamProbe(1, heads, rows, omega, visual, tokens)
            syncs, _ = synchronisations(device, probe.pre, call)
        finally:
            probes.chunk_bytes = original
        masses[name] = torch.stack([probe.mass[0], probe.visual_mass[0]])
        chunk = probes.rows_per_chunk(heads, tokens, (budget or probes.chunk_bytes(device)))
        print(f"probe {name}: {chunk} rows per chunk, synchronisations in one layer: {syncs}")
    diff = (masses["batched"] - masses["row by row"]).abs().max().item()
    print(
        f"probe batched vs row by row, N={tokens} bf16 GQA: max |diff| {diff:.2e} (tolerance 1e-05)",
        "ok" if diff < 1e-5 else "FAIL",
    )
    return diff < 1e-5


def decode_check(device: torch.device, dtype: str) -> bool:
    """Print trimmed-cache decoding against the dense rule token by token; return whether within tolerance."""
    counted = {"syncs": 0}

    def counting(fn):
        def run(*args, **kwargs):
            syncs, result = synchronisations(device, fn, *args, **kwargs)
            counted["syncs"] += max(syncs, 0)
            return result

        return run

    model = build_model(
        layers=2, hidden=512, heads=8, kv_heads=4, intermediate=1024, device=str(device), dtype=dtype
    )
    ids = make_input_ids(600, 1024, 1).to(device)
    policy = [
        (0, 0),
        (0, 1),
        (1, 4),
    ]  # layer 0: KV head 0 full; layer 1: KV head 2 full (mixed with a stream)
    logits = {}
    originals = HybridCacheLayer._update_trimmed, HybridHook._trimmed
    for kernel in ("auto", "reference"):
        model.set_attn_implementation("corelens")
        steps = []
        if kernel == "auto":
            HybridCacheLayer._update_trimmed, HybridHook._trimmed = (counting(f) for f in originals)
        try:
            with (
                torch.no_grad(),
                HybridAttention(tuple(policy), 16, 64, kernel=kernel, decode="stream").applied(model) as on,
            ):
                h = on.hooks[0].session
                cache = h.cache() if kernel == "auto" else DynamicCache(config=model.config)
                model(input_ids=ids[:, :560], cache=cache, use_cache=True)
                for t in range(560, 600):
                    steps.append(
                        model(input_ids=ids[:, t : t + 1], cache=cache, use_cache=True).last_hidden_state
                    )
        finally:
            HybridCacheLayer._update_trimmed, HybridHook._trimmed = originals
        logits[kernel] = torch.cat(steps, 1).float()
        print(f"decode {kernel}: {dict(h.stats)}")
    diff = (logits["auto"] - logits["reference"]).abs().max().item()
    scale = logits["reference"].abs().max().item()
    tol = 1e-4 if dtype == "float32" else 3e-2
    ok = diff <= tol * max(1.0, scale)
    print(f"decode trimmed vs dense rule ({dtype}, 40 steps): max |diff| {diff:.2e} of {scale:.2e}"
          f" (tolerance {tol:.0e} x max(1, scale))", "ok" if ok else "FAIL")  # fmt: skip
    syncs = counted["syncs"] if device.type == "cuda" else "not counted (CPU)"
    print(f"decode: synchronisations in the cache writes and trimmed kernels of 80 layer-steps: {syncs}")
    return ok


def main(argv: list[str] | None = None) -> int:
    """Run the checks; return 1 when one is past its tolerance (the command's exit status), else 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", type=int, default=8192)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    ok = [probe_check(device, args.tokens)] + [
        decode_check(device, dtype) for dtype in ("float32", "bfloat16")
    ]
    if not all(ok):
        print(f"probe / decode parity FAILED: {ok.count(False)} of {len(ok)} checks past their tolerance")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
