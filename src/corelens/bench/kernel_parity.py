"""GPU parity of the hybrid kernels: compiled FlexAttention and the partitioned kernel against a literal dense
masked softmax (CUDA, fp32; the partitioned kernel also in bfloat16 on a 28 / 4-head GQA shape).

For random post-RoPE-shaped q / k / v, a random full-head set and left padding in one batch row, the
`flex`, `partitioned` and `auto` kernels are compared with attention under the rule written out here,
independently of corelens.attention.kernels.masks: query i sees key j iff j <= i, j is real, and (the head is
full, or j - start < S, or i - j < W). The partitioned kernel runs with each streaming path (`STREAMS`: the
Triton kernel where Triton runs here, on a CPU only under TRITON_INTERPRET=1, the FlexAttention passes, and
flash-attention's window + sink calls, on CUDA in bfloat16 only, on a CPU through their dense reference), and
once with the full heads on a second CUDA stream (`streams=2`).
Every difference is held to a stated tolerance (`TOLERANCE`, per dtype, of the largest |output|); past it the
line says FAIL and the command exits 1. Usage (device machine): python3 -m corelens.bench.kernel_parity (or
benchmarks/gpu_parity.py); on a CPU, `--dry-run` checks one small size.
"""

from __future__ import annotations

import sys

import torch

from corelens.attention.kernels import Pattern, flashstream, prefill
from corelens.attention.kernels import stream as triton_stream

# Largest |got - want| allowed, relative to max(1, max |want|): fp32 sums in another order; bf16 rounds q, k,
# v, the probabilities and the output (about 2^-8 each).
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
# The dry run's (n, S, W, left padding of row 1) and its 28 / 4-head (n, S, W).
DRY_SIZES = ((300, 4, 64, 37),)
DRY_WIDE = (300, 8, 64)


def streams(device: torch.device, dtype: torch.dtype = torch.float32) -> tuple[str, ...]:
    """Return the partitioned kernel's streaming paths that can run on `device` in `dtype`."""
    triton_runs = triton_stream.available() and (device.type == "cuda" or triton_stream.interpreting())
    flash_runs = device.type != "cuda" or dtype in (torch.float16, torch.bfloat16)  # flash: 16-bit only
    return ("triton",) * triton_runs + ("flex",) + ("flash",) * flash_runs


def check(label: str, got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, failures: list[str]) -> None:
    """Print the max |got - want| of one kernel against its tolerance; add `label` to `failures` past it."""
    diff = (got.float() - want.float()).abs().max().item()
    tol = TOLERANCE[dtype] * max(1.0, want.abs().max().item())
    ok = diff <= tol
    print(f"{label}: max abs diff {diff:.2e} (tolerance {tol:.1e}) {'ok' if ok else 'FAIL'}")
    if not ok:
        failures.append(label)


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


def main(argv: list[str] | None = None) -> int:
    """Run the checks; return 0, or 1 when a kernel is past its tolerance (the command's exit status)."""
    torch.manual_seed(0)
    dry = "--dry-run" in (sys.argv[1:] if argv is None else argv)
    device = torch.device(
        "cuda" if torch.cuda.is_available() and not dry else "cpu"
    )  # CPU: a slow local check
    failures: list[str] = []
    sizes = DRY_SIZES if dry else ((700, 4, 64, 37), (2048, 128, 256, 300), (4096, 128, 1024, 0))
    paths = streams(device)
    for n, sink, window, pad in sizes:
        q = torch.randn(2, 8, n, 64, device=device)
        k, v = torch.randn(2, 2, n, 64, device=device), torch.randn(2, 2, n, 64, device=device)
        full = torch.rand(8) < 0.3
        starts = torch.tensor([0, pad])
        mask = (torch.arange(n)[None, :] >= starts[:, None]).to(device)
        causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        model = (causal[None] & mask[:, None, :])[:, None]  # (batch, 1, n, n) booleans, as sdpa's mask
        want = literal(q, k, v, starts.tolist(), full.tolist(), sink, window, 0.125)
        want = want * mask[:, :, None, None]  # padding rows: compared as zeros
        kinds = [("partitioned", {"stream": s}) for s in paths] + [("partitioned", {"streams": 2})]
        kinds += [("reference", {})]
        if not dry:  # compiled flex and `auto` (no compile in a dry run)
            kinds += [("flex", {}), ("auto", {})]
        for kind, options in kinds:
            label = f"N={n} S={sink} W={window} pad={pad} {kind}{options or ''}"
            got, ran = attempt(kind, (q, k, v, model, full, Pattern(sink, window), 0.125), options, label)
            if got is None:
                continue
            label += f" ({ran})"
            check(label, got * mask[:, :, None, None], want, torch.float32, failures)
    # bfloat16, Qwen2.5-VL-7B's head layout (28 query heads over 4 KV heads, head dim 128), 20 % full heads.
    n, sink, window = DRY_WIDE if dry else (4096, 128, 1024)
    dtype = torch.float32 if dry else torch.bfloat16
    q = torch.randn(1, n, 28, 128, device=device).to(dtype).transpose(1, 2)  # the model's strided layout
    k, v = (torch.randn(1, n, 4, 128, device=device).to(dtype).transpose(1, 2) for _ in range(2))
    full = torch.zeros(28, dtype=torch.bool)
    full[torch.randperm(28)[:6]] = True
    want = literal(q.float(), k.float(), v.float(), [0], full.tolist(), sink, window, 128**-0.5)
    for stream in streams(device, dtype):
        args = (q, k, v, None, full, Pattern(sink, window), 128**-0.5)
        label = f"N={n} S={sink} W={window} {dtype} 28/4 heads partitioned stream={stream}"
        got, ran = attempt("partitioned", args, {"stream": stream}, label)
        if got is None:
            continue
        label += f" ({ran})"
        check(label, got, want, dtype, failures)
    if failures:
        print(f"kernel parity FAILED ({len(failures)}): " + "; ".join(failures))
        return 1
    print("kernel parity: every kernel within its tolerance")
    return 0


def attempt(kind: str, args: tuple, options: dict, label: str) -> tuple[torch.Tensor | None, str]:
    """Return `run`'s result, or (None, reason) where the flash candidate's operator refuses on this machine.

    The flash path needs this torch build's flash-attention with a window: where the operator refuses, the
    path is no candidate here (the anatomy skips it too), not a wrong kernel; a wrong result still fails.
    """
    try:
        return run(kind, args, options)
    except flashstream.REFUSALS as err:
        if options.get("stream") != "flash":
            raise
        reason = flashstream.refusal(err)
        print(f"{label}: unavailable ({reason}); not a candidate here")
        return None, reason


def run(kind: str, args: tuple, options: dict) -> tuple[torch.Tensor, str]:
    """Return one kernel's output and the kernel that ran (no fallback: a failure is an error here)."""
    if options:  # a streaming path named: the partitioned kernel itself, no crossover
        from corelens.attention.kernels import IMPLEMENTATIONS

        return IMPLEMENTATIONS[kind](*args, **options), kind
    got, ran, _ = prefill(kind, *args, fallback=None)
    return got, ran


if __name__ == "__main__":
    sys.exit(main())
