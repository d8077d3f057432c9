"""Where one layer's hybrid attention spends its time, part by part, against stock sdpa (the GPU anatomy step).

At N tokens, for a query-granular head set with full-head share F (default 20 %), on random q, k, v in the
model's layout (transposed views of (batch, n, heads, dim)):

- ``stock``: stock causal sdpa over every head (the baseline);
- ``full only``: causal sdpa over the full heads alone (gathered into one call);
- ``triton stream``: the streaming heads in the Triton kernel (`attention/kernels/stream.py`; where it runs);
- ``flex window``, ``flex sink``, ``merge``: the FlexAttention path's three parts for the streaming heads;
- ``flash window``, ``flash sink``, ``flash merge``, ``flash stream``: the flash candidate's parts
  (`attention/kernels/flashstream.py`: the left-window call, the two top-left sink calls, the fused merges)
  and the whole of it, for the streaming heads;
- ``hybrid``: the whole partitioned kernel (its default streaming path on this device, no crossover);
  ``hybrid triton`` / ``hybrid flash``: with each CUDA streaming path (where it runs); ``hybrid streams=2``:
  the default path with the full heads on a second CUDA stream (`partition.two_streams`: one stream off a
  GPU, where it is the same computation);
- ``first stock`` / ``first hybrid``: the first call at a length not seen before (N + 64): graph builds,
  compiles, block masks.

The result names the faster of ``hybrid triton`` and ``hybrid flash`` (``faster_stream``), which
`corelens.bench.crossover_table --anatomy` writes into the crossover table for `--kernel auto`. Off a GPU the
flash parts run the dense reference of the same contract (`flashstream.reference_windowed`) and the Triton
kernel runs under Triton's interpreter: the dry run's numbers say that each step runs, not which is faster.

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

from corelens.attention.kernels import Pattern, flashstream, partitioned
from corelens.attention.kernels import partition as part
from corelens.attention.kernels import stream as triton_stream
from corelens.attention.kernels.crossover import device_name
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

    def hybrid(x=qn, y=kn, z=vn, path=stream, streams=1):
        return partitioned(x, y, z, None, full, pattern, scale, stream=path, streams=streams)

    # The flash candidate's parts, on the streaming heads in flash's layout (batch, n, heads, dim).
    windowed = flashstream.default_windowed(device)
    qf, kf, vf = (x.transpose(1, 2) for x in (qs, ks, vs))
    sink_calls = flashstream.sink_calls(tokens, pattern)
    flash_error = None
    if device.type == "cuda" and dtype not in (torch.float16, torch.bfloat16):
        flash_error = f"flash-attention takes float16 / bfloat16, not {dtype}"
    else:
        try:  # where this torch build's flash operator refuses a window, the candidate is skipped, and said so
            flash_out, flash_lse = windowed(qf, kf, vf, causal=True, window=window, scale=scale)
            sinks = [
                (rows_, windowed(qf[:, rows_], kf[:, :s], vf[:, :s], causal=causal, window=None, scale=scale))
                for rows_, causal in sink_calls
            ]
        except flashstream.REFUSALS as err:
            flash_error = flashstream.refusal(err)

    def flash_sink():
        for rows_, causal in sink_calls:
            windowed(qf[:, rows_], kf[:, :s], vf[:, :s], causal=causal, window=None, scale=scale)

    def flash_merge():
        merged = flash_out.clone() if device.type != "cuda" else flash_out  # in place on the GPU: timing only
        for rows_, (o, lse) in sinks:
            flashstream.merge_(merged[:, rows_], flash_lse[..., rows_], o, lse)

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
    triton_runs = triton_stream.available() and (device.type == "cuda" or triton_stream.interpreting())
    if triton_runs:
        times["triton stream"] = median(
            lambda: triton_stream.streaming_into(out, qn, kn, vn, sidx, stream_kv, None, pattern, scale),
            device,
            repeats,
        )
    flash_runs = flash_error is None
    if flash_runs:
        times["flash window"] = median(
            lambda: windowed(qf, kf, vf, causal=True, window=window, scale=scale), device, repeats
        )
        if sink_calls:
            times["flash sink"] = median(flash_sink, device, repeats)
            times["flash merge"] = median(flash_merge, device, repeats)
        times["flash stream"] = median(
            lambda: flashstream.streaming(qs, ks, vs, pattern, scale, windowed), device, repeats
        )
    times["hybrid"] = median(hybrid, device, repeats)
    paths = [p for p, runs in (("triton", triton_runs), ("flash", flash_runs)) if runs]
    for path in paths:
        times[f"hybrid {path}"] = median(lambda p=path: hybrid(path=p), device, repeats)
    times["hybrid streams=2"] = median(lambda: hybrid(streams=2), device, repeats)
    part.layout.cache_clear()  # no state carried into a caller's next measurement
    faster = min(paths, key=lambda p: times[f"hybrid {p}"]) if paths else None
    return {
        "tokens": tokens, "keep": keep, "full_heads": fidx.tolist(), "stream": stream, "sink": sink,
        "window": window, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "dtype": str(dtype),
        "device": str(device), "device_name": device_name(device), "repeats": repeats, "seconds": times,
        "faster_stream": faster, "streams": {"asked": 2, "used": part.two_streams(2, device)},
        "flash_error": flash_error,
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
        print(f"  {name:17s} {s * 1e3:9.3f} ms  {s / stock:6.2f}x stock")
    used = result["streams"]["used"]
    print(f"  streams=2 ran on {used} CUDA stream{'s' if used > 1 else ' (no GPU: the one-stream path)'}")
    if result["flash_error"]:
        print(f"  flash path not timed: {result['flash_error']}")
    if result["faster_stream"]:
        print(f"  faster streaming path: {result['faster_stream']} (hybrid triton against hybrid flash)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
