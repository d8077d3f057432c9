"""Where one layer's hybrid attention spends its time, part by part, against stock sdpa (the GPU anatomy step).

At N tokens, for a query-granular head set with full-head share F (default 20 %), on random q, k, v in the
model's layout (transposed views of (batch, n, heads, dim)):

- ``stock``: stock causal sdpa over every head (the baseline);
- ``full only``: causal sdpa over the full heads alone (gathered into one call);
- ``triton stream``: the streaming heads in the Triton kernel (`attention/kernels/stream.py`; where it runs);
- ``flex window``, ``flex sink``, ``merge``: the FlexAttention path's three parts for the streaming heads;
- ``hybrid``: the whole partitioned kernel (its default streaming path on this device, no crossover);
- ``first stock`` / ``first hybrid``: the first call at a length not seen before (N + 64): graph builds,
  compiles, block masks.

Each part: one warm-up call at the timed length, then the median of `repeats` (>= 3) calls; CUDA events on a
GPU, wall time after a synchronisation elsewhere. A miss of the kernel table is then read here: which part is
slow. Usage: `python -m corelens.bench.stream_anatomy --device cuda --tokens 32768 --json FILE`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from corelens.attention.kernels import Pattern, partitioned
from corelens.attention.kernels import partition as part
from corelens.attention.kernels import stream as triton_stream
from corelens.attention.kernels.partition import _flex_lse, default_stream, sink_block_mask, window_block_mask
from corelens.bench.hybrid_kernels import choose_full, model_layout
from corelens.bench.synthetic import sync


def seconds(fn, device: torch.device) -> float:
    """Return the seconds of one call of `fn` (CUDA events on a GPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000
    sync(device)
    begin = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - begin


def median(fn, device: torch.device, repeats: int) -> float:
    """Return the median seconds of `repeats` calls after one warm-up call."""
    fn()
    return statistics.median(seconds(fn, device) for _ in range(repeats))


def parts(
    tokens: int, *, keep: float, heads: int, kv_heads: int, head_dim: int, sink: int, window: int,
    repeats: int, device: torch.device, dtype: torch.dtype, seed: int = 0,
) -> dict:  # fmt: skip
    """Return the seconds of each part (module docstring) and the head set they ran."""
    g = torch.Generator().manual_seed(seed)
    fresh = tokens + 64
    q, k, v = (model_layout(1, h, fresh, head_dim, g, device, dtype) for h in (heads, kv_heads, kv_heads))
    qn, kn, vn = (x[:, :, :tokens] for x in (q, k, v))
    scale, pattern = head_dim**-0.5, Pattern(sink, window)
    full = torch.zeros(heads, dtype=torch.bool)
    full[choose_full(heads, keep, seed, 1)] = True
    group = heads // kv_heads
    fidx = full.nonzero().flatten().to(device)
    sidx = (~full).nonzero().flatten().to(device)
    stream_kv = (sidx // group).to(device)
    out = torch.empty(1, tokens, heads, head_dim, device=device, dtype=dtype)

    def stock(x=qn, y=kn, z=vn):
        return F.scaled_dot_product_attention(x, y, z, is_causal=True, scale=scale, enable_gqa=group > 1)

    def full_only():
        kf, vf = kn.index_select(1, fidx // group), vn.index_select(1, fidx // group)
        return F.scaled_dot_product_attention(qn.index_select(1, fidx), kf, vf, is_causal=True, scale=scale)

    qs, ks, vs = qn.index_select(1, sidx), kn.index_select(1, stream_kv), vn.index_select(1, stream_kv)
    compiled = device.type == "cuda"
    win_mask = window_block_mask(tokens, pattern, str(device))
    rows = slice(None), slice(None), slice(window, None)
    s = min(sink, tokens - window)
    sink_mask = sink_block_mask(tokens, pattern, str(device)) if s > 0 else None
    win_out, win_lse = _flex_lse(qs, ks, vs, win_mask, scale, compiled)
    sink_out, sink_lse = (
        _flex_lse(qs[rows], ks[:, :, :s], vs[:, :, :s], sink_mask, scale, compiled) if s > 0 else (None, None)
    )

    def merge():
        weight = torch.sigmoid(sink_lse.float() - win_lse[rows].float())[..., None]
        return win_out[rows].float().lerp(sink_out.float(), weight).to(dtype)

    stream = default_stream(device)

    def hybrid(x=qn, y=kn, z=vn):
        return partitioned(x, y, z, None, full, pattern, scale, stream=stream)

    times = {
        "first stock": seconds(lambda: stock(q, k, v), device),
        "first hybrid": seconds(lambda: hybrid(q, k, v), device),
        "stock": median(stock, device, repeats),
        "full only": median(full_only, device, repeats),
        "flex window": median(lambda: _flex_lse(qs, ks, vs, win_mask, scale, compiled), device, repeats),
    }
    if s > 0:
        times["flex sink"] = median(
            lambda: _flex_lse(qs[rows], ks[:, :, :s], vs[:, :, :s], sink_mask, scale, compiled),
            device,
            repeats,
        )
        times["merge"] = median(merge, device, repeats)
    if stream == "triton" or (triton_stream.available() and triton_stream.interpreting()):
        times["triton stream"] = median(
            lambda: triton_stream.streaming_into(out, qn, kn, vn, sidx, stream_kv, None, pattern, scale),
            device,
            repeats,
        )
    times["hybrid"] = median(hybrid, device, repeats)
    part.layout.cache_clear()  # no state carried into a caller's next measurement
    return {
        "tokens": tokens, "keep": keep, "full_heads": fidx.tolist(), "stream": stream, "sink": sink,
        "window": window, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "dtype": str(dtype),
        "device": str(device), "repeats": repeats, "seconds": times,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--keep", type=float, default=0.2)
    parser.add_argument("--heads", type=int, default=28)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--sink", type=int, default=128)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.repeats < 3:
        print(
            "stream_anatomy: --repeats must be >= 3 (a median of fewer is not a measurement)", file=sys.stderr
        )
        return 2
    result = parts(
        args.tokens, keep=args.keep, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
        sink=args.sink, window=args.window, repeats=args.repeats, device=torch.device(args.device),
        dtype=getattr(torch, args.dtype),
    )  # fmt: skip
    stock = result["seconds"]["stock"]
    print(f"anatomy N={args.tokens} F={args.keep:.0%} ({result['stream']} streaming path), one layer:")
    for name, s in result["seconds"].items():
        print(f"  {name:14s} {s * 1e3:9.3f} ms  {s / stock:6.2f}x stock")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
