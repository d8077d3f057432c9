"""Where the hybrid CPU kernel's time goes (backs the README's gap analysis); run from the repository root:

    .venv/bin/python benchmarks/hybrid_anatomy.py

1. Cost per (query, key) pair: stock causal sdpa over 16 heads / 2 KV heads at 16k tokens, against one chunk
   of streaming tiles as `streaming_group` builds them (7 stacked heads, S = 128, W = 1024), with and without
   the additive band mask (the unmasked call is not a correct result, only the mask's share of the time).
2. One causal call against `causal_balanced` for 1 and 3 heads at 4k and 16k tokens.
Each time is the best of 3 after a warm-up, all cores.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from corelens.attention.kernels.tiles import _additive, block_size, causal_balanced, tile_rule


def best(fn, repeats: int = 3) -> float:
    """Return the shortest of `repeats` timed calls of `fn` after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    """Print the per-pair costs and the balanced-split timings."""
    torch.manual_seed(0)
    n, d, sink, window, groups = 16384, 128, 128, 1024, 7
    q = torch.randn(1, 16, n, d)
    k, v = torch.randn(1, 2, n, d), torch.randn(1, 2, n, d)
    stock = best(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), 1)
    print(
        f"stock causal sdpa, 16 heads at {n}: {stock:.2f} s = {stock / (16 * n * (n + 1) / 2) * 1e9:.2f} ns/pair"
    )
    b = block_size(groups)
    keys, tiles = sink + window + b - 1, 77
    qt = torch.randn(tiles, 1, groups * b, d)
    kt, vt = torch.randn(tiles, 1, keys, d), torch.randn(tiles, 1, keys, d)
    bias = _additive(tile_rule(b, sink, window)[None], groups)
    masked = best(lambda: F.scaled_dot_product_attention(qt, kt, vt, attn_mask=bias))
    unmasked = best(lambda: F.scaled_dot_product_attention(qt, kt, vt))
    kept = tiles * groups * b * (sink + window)
    print(
        f"streaming tiles (B = {b}, {keys} keys per tile): {masked / kept * 1e9:.2f} ns per kept pair, "
        f"{masked / (kept * keys / (sink + window)) * 1e9:.2f} ns per computed pair; "
        f"the band mask costs {masked / unmasked - 1:.0%}, the masked band columns {(b - 1) / (sink + window):.1%}"
    )
    for length in (4096, 16384):
        for heads in (1, 3):
            x = [torch.randn(1, heads, length, d) for _ in range(3)]
            plain = best(lambda x=x: F.scaled_dot_product_attention(*x, is_causal=True, scale=0.1))
            split = best(lambda x=x: causal_balanced(*x, 0.1))
            print(
                f"N = {length}, {heads} head(s): one causal call {plain:.3f} s, causal_balanced {split:.3f} s"
            )


if __name__ == "__main__":
    main()
