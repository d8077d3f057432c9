"""GPU parity of the hybrid kernels: compiled FlexAttention and the partitioned kernel against a literal dense
masked softmax (CUDA, fp32; the partitioned kernel also in bfloat16 on a 28 / 4-head GQA shape).

For random post-RoPE-shaped q / k / v, a random full-head set and left padding in one batch row, the
`flex`, `partitioned` and `auto` kernels are compared with attention under the rule written out here,
independently of corelens.attention.kernels.masks: query i sees key j iff j <= i, j is real, and (the head is
full, or j - start < S, or i - j < W). Usage (device machine): python3 -m corelens.bench.kernel_parity (or
benchmarks/gpu_parity.py); on a CPU, `--dry-run` checks one small size.
"""

from __future__ import annotations

import sys

import torch

from corelens.attention.kernels import Pattern, prefill


def literal(q, k, v, starts, full, sink, window, scale):
    batch, heads, n, _ = q.shape
    i = torch.arange(n, device=q.device)[:, None]
    j = torch.arange(n, device=q.device)[None, :]
    out = torch.empty_like(q)
    groups = heads // k.shape[1]
    for b in range(batch):
        real = j >= starts[b]
        stream = (j <= i) & real & ((j - starts[b] < sink) | (i - j < window))
        dense = (j <= i) & real
        for h in range(heads):
            allowed = dense if full[h] else stream
            scores = (q[b, h] @ k[b, h // groups].T) * scale
            scores = scores.masked_fill(~allowed, float("-inf"))
            probs = torch.softmax(scores, -1).nan_to_num(0.0)
            out[b, h] = probs @ v[b, h // groups]
    return out.transpose(1, 2)


def main() -> None:
    torch.manual_seed(0)
    dry = "--dry-run" in sys.argv[1:]
    device = torch.device(
        "cuda" if torch.cuda.is_available() and not dry else "cpu"
    )  # CPU: a slow local check
    sizes = ((300, 4, 64, 37),) if dry else ((700, 4, 64, 37), (2048, 128, 256, 300), (4096, 128, 1024, 0))
    for n, sink, window, pad in sizes:
        q = torch.randn(2, 8, n, 64, device=device)
        k, v = torch.randn(2, 2, n, 64, device=device), torch.randn(2, 2, n, 64, device=device)
        full = torch.rand(8) < 0.3
        starts = torch.tensor([0, pad])
        mask = (torch.arange(n)[None, :] >= starts[:, None]).to(device)
        causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        model = (causal[None] & mask[:, None, :])[:, None]  # (batch, 1, n, n) booleans, as sdpa's mask
        want = literal(q, k, v, starts.tolist(), full.tolist(), sink, window, 0.125)
        kinds = (
            ("partitioned", "reference") if dry else ("flex", "partitioned", "auto", "reference")
        )  # no compile
        for kind in kinds:
            got, ran, _ = prefill(kind, q, k, v, model, full, Pattern(sink, window), 0.125, fallback=None)
            diff = ((got - want).abs() * mask[:, :, None, None]).max().item()
            print(f"N={n} S={sink} W={window} pad={pad} {kind} ({ran}): max abs diff {diff:.2e}")
    # bfloat16, Qwen2.5-VL-7B's head layout (28 query heads over 4 KV heads, head dim 128), 20 % full heads.
    n, sink, window = (300, 8, 64) if dry else (4096, 128, 1024)
    dtype = torch.float32 if dry else torch.bfloat16
    q = torch.randn(1, n, 28, 128, device=device).to(dtype).transpose(1, 2)  # the model's strided layout
    k, v = (torch.randn(1, n, 4, 128, device=device).to(dtype).transpose(1, 2) for _ in range(2))
    full = torch.zeros(28, dtype=torch.bool)
    full[torch.randperm(28)[:6]] = True
    want = literal(q.float(), k.float(), v.float(), [0], full.tolist(), sink, window, 128**-0.5)
    got, ran, _ = prefill("partitioned", q, k, v, None, full, Pattern(sink, window), 128**-0.5, fallback=None)
    diff = (got.float() - want).abs().max().item()
    print(f"N={n} S={sink} W={window} {dtype} 28/4 heads partitioned ({ran}): max abs diff {diff:.2e}")


if __name__ == "__main__":
    main()
