"""Where the hybrid CPU kernel's time goes (backs docs/performance.md's gap analysis and the kernel's constants).

Run from the repository root: `.venv/bin/python -m corelens.bench.hybrid_anatomy` or `benchmarks/hybrid_anatomy.py`
(about 3 minutes on 2 cores).

1. Cost per (query, key) pair: stock causal sdpa over 16 heads / 2 KV heads at 16k tokens, against the
   streaming heads of one KV head (`streaming_group`, S = 128, W = 1024; 8 and 5 stacked query heads) on
   each path (the C++ band kernel, the split tiles, the masked tiles); 5 scattered heads against 5
   consecutive ones; the band kernel's tile height R and the split path's block size B.
2. The price of fresh pages (a 1 GB tensor filled fresh and refilled), and the split path with every sdpa
   output under `OUT_BYTES` (16 MB) against one call per KV head: the time and the minor page faults (fresh
   pages of blocks above glibc's 32 MB mmap threshold).
3. One causal call against `causal_balanced` for 1, 2, 3 and 5 heads at 4k and 16k tokens.
Variants of one measurement run interleaved, each time the best of 3 after a warm-up, all cores.
"""

from __future__ import annotations

import resource
import time

import torch
import torch.nn.functional as F

from corelens.attention.kernels import Pattern, causal, pairs, tiles, tiling

SINK, WINDOW, DIM = 128, 1024, 128


def interleaved(fns: dict, repeats: int = 3) -> dict[str, float]:
    """Return the best of `repeats` timed calls of each function, the variants taking turns after a warm-up."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: min(t) for name, t in times.items()}


def faults() -> int:
    """Return this process's minor page faults so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def streaming(n: int, groups: int, block: int | None, path: str, heads: list[int] | None = None):
    """Return a `streaming_group` call on random fp32 inputs of one KV head, query heads `heads` (or 0..groups-1)."""
    g = torch.Generator().manual_seed(groups)
    q = torch.randn(8, n, DIM, generator=g)
    k, v = torch.randn(n, DIM, generator=g), torch.randn(n, DIM, generator=g)
    out = torch.empty(n, 8, DIM)
    heads = torch.tensor(heads or list(range(groups)))
    group = tiling.Group(q, heads, k, v, out, Pattern(SINK, WINDOW), DIM**-0.5)
    return lambda: tiles.streaming_group(group, block, tiling.Scratch(q.device), path=path)


def stock_per_pair(n: int) -> float:
    """Print and return stock causal sdpa's ns per (query, key) pair over 16 heads / 2 KV heads at `n` tokens."""
    torch.manual_seed(0)
    q = torch.randn(1, 16, n, DIM)
    k, v = torch.randn(1, 2, n, DIM), torch.randn(1, 2, n, DIM)
    seconds = interleaved(
        {"stock": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)}, 1
    )
    per_pair = seconds["stock"] / (16 * n * (n + 1) / 2) * 1e9
    print(f"stock causal sdpa, 16 heads at {n}: {seconds['stock']:.2f} s = {per_pair:.2f} ns/pair")
    return per_pair


def fresh_pages() -> None:
    """Print the time to fill a fresh 1 GB tensor (its pages faulted in) against refilling it."""
    fresh, again = [], []
    for _ in range(3):
        start = time.perf_counter()
        x = torch.empty(256 << 20)
        x.fill_(1.0)
        fresh.append(time.perf_counter() - start)
        start = time.perf_counter()
        x.fill_(2.0)
        again.append(time.perf_counter() - start)
        del x
    print(f"1 GB tensor: fresh fill {min(fresh):.3f} s, refill {min(again):.3f} s")


def main() -> None:
    """Print the per-pair costs, the tile sweeps, the page-fault comparison and the balanced-split timings."""
    fresh_pages()
    n = 16384
    per_pair = stock_per_pair(n)
    for groups in (8, 5):
        kept = groups * pairs(n, SINK, WINDOW)[1]
        t = interleaved({path: streaming(n, groups, None, path) for path in tiles.PATHS})
        print(
            f"streaming, {groups} heads on one KV head, ns per kept pair (x stock): "
            + ", ".join(
                f"{path} {s / kept * 1e9:.2f} ({s / kept * 1e9 / per_pair:.2f}x)" for path, s in t.items()
            )
        )
    scattered = [0, 3, 5, 6, 7]  # three runs of consecutive heads, read and written through views
    for path in ("band", "split"):
        t = interleaved(
            {"runs": streaming(n, 5, None, path, scattered), "consecutive": streaming(n, 5, None, path)}
        )
        print(f"{path}, 5 heads {scattered} against heads 0-4: {t['runs'] / t['consecutive']:.2f}x the time")
    sweep = interleaved({str(r): streaming(n, 8, r, "band") for r in (8, 16, 24, 32, 64)})
    print("band tile height R, 8 heads: " + ", ".join(f"R = {r}: {s:.3f} s" for r, s in sweep.items()))
    sweep = interleaved({str(b): streaming(n, 8, b, "split") for b in (48, 64, 96, 128)})
    print("split block B, 8 heads: " + ", ".join(f"B = {b}: {s:.3f} s" for b, s in sweep.items()))

    run = streaming(n, 8, None, "split")
    for label, limit in (("outputs <= 16 MB", 16 << 20), ("one call (outputs 48 MB)", 1 << 40)):
        tiling.OUT_BYTES = limit
        run()
        best, pages = float("inf"), 0
        for _ in range(3):
            before, start = faults(), time.perf_counter()
            run()
            best, pages = min(best, time.perf_counter() - start), faults() - before
        print(f"split tiles, 8 heads, {label}: {best:.3f} s, {pages} minor page faults per call")
    tiling.OUT_BYTES = 16 << 20

    for length in (4096, 16384):
        for heads in (1, 2, 3, 5):
            x = [torch.randn(1, heads, length, DIM) for _ in range(3)]
            t = interleaved(
                {
                    "one": lambda x=x: F.scaled_dot_product_attention(*x, is_causal=True, scale=0.1),
                    "split": lambda x=x: causal.causal_balanced(*x, 0.1),
                }
            )
            pays = causal.balance_pays(heads, length, torch.get_num_threads())
            print(
                f"N = {length}, {heads} head(s): one causal call {t['one']:.3f} s, causal_balanced {t['split']:.3f} s "
                f"({t['one'] / t['split']:.2f}x; balance_pays: {pays})"
            )


if __name__ == "__main__":
    main()
