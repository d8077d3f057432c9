"""The full heads of the blocked CPU path: causal sdpa, split so that every CPU thread gets equal work."""

from __future__ import annotations

import torch
import torch.nn.functional as F

BALANCED_MIN = 256  # prompt length from which plain causal heads may take `balanced_parts` on the CPU
Q_SPLIT = 256  # query rows per work unit of the CPU flash kernel (for prompts of 768 rows or more)


def _busiest(costs: list[float], threads: int) -> float:
    """Return the largest sum of one thread's share when `costs` are cut into `threads` contiguous chunks."""
    size = -(-len(costs) // threads)
    return max(sum(costs[i : i + size]) for i in range(0, len(costs), size))


def balance_pays(units: int, n: int, threads: int) -> bool:
    """Return whether `balanced_parts` beats one causal call for `units` = batch x heads on `threads`.

    The flash kernel hands each thread a contiguous run of (unit, query block) items; a causal block's work
    is the keys it sees. Predicts the busiest thread's work both ways; the split must win by its own cost,
    O(n) copies and a merge against the O(n^2) call: a margin of 5 % at 16k tokens, scaled by 16k / n.
    Measured against the prediction: benchmarks/README.md#hybrid-kernel-constants.
    """
    if threads < 2:
        return False
    blocks, h = -(-n // Q_SPLIT), (n + 1) // 2
    half = -(-h // Q_SPLIT)
    plain = [i + 0.5 for _ in range(units) for i in range(blocks)]
    diag = [i + 0.5 for _ in range(2 * units) for i in range(half)]
    rect = [float(half)] * (units * half)
    margin = 1 + 0.05 * 16384 / n
    return margin * (_busiest(diag, threads) + _busiest(rect, threads)) < _busiest(plain, threads)


def _halves(x: torch.Tensor, h: int) -> torch.Tensor:
    """Return (2 batch, heads, h, dim): rows :h of `x`, then rows h: (one zero row appended if n is odd)."""
    batch, heads, n, dim = x.shape
    if batch == 1 and n == 2 * h:  # a view: the second half is the first shifted by h rows
        return x.as_strided((2, heads, h, dim), (h * x.stride(2), x.stride(1), x.stride(2), x.stride(3)))
    return torch.cat([x[:, :, :h], F.pad(x[:, :, h:], (0, 0, 0, 2 * h - n))])


def balanced_parts(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return causal sdpa of q over k, v (batch, heads, n, dim) as its rows :ceil(n/2) and the rest, balanced.

    The CPU flash kernel hands each thread a contiguous run of (batch, head, query block) units; under a
    causal mask the late query blocks cost the most, so with an odd number of heads one thread gets most of
    the work (`balance_pays`). Split at h = ceil(n / 2): the two causal diagonal halves run as one batch of
    two equal problems (the upper half padded by one zero row if n is odd: a key after every real query is
    masked, an extra query row is dropped) and the upper queries' rectangle over the lower keys runs as a
    plain (uniform) call; the two parts of the upper rows merge exactly through their log-sum-exps (the
    weight of the rectangle is sigmoid(lse_rect - lse_diag), merged in place). For one prompt of even
    length the halves are views of the inputs, not copies.
    """
    batch, n = q.shape[0], q.shape[2]
    h = (n + 1) // 2
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    diag, diag_lse = flash(_halves(q, h), _halves(k, h), _halves(v, h), 0.0, True, scale=scale)
    rect, rect_lse = flash(q[:, :, h:], k[:, :, :h], v[:, :, :h], 0.0, False, scale=scale)
    top, top_lse = diag[batch:, :, : n - h], diag_lse[batch:, :, : n - h]
    return diag[:batch], top.lerp_(rect, torch.sigmoid(rect_lse - top_lse)[..., None])


def causal_balanced(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Return causal sdpa of q over k, v (batch, heads, n, dim) with equal work per CPU thread (`balanced_parts`)."""
    return torch.cat(balanced_parts(q, k, v, scale), dim=2)


def full_heads(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    heads: torch.Tensor,
    scale: float,
    out: torch.Tensor,
) -> None:
    """Write causal sdpa of the query heads `heads` into their heads of `out` (batch, n, all heads, dim_v).

    On the CPU (fp32, plain causal) where one head alone would leave a thread idle (`balance_pays`), each
    head runs on its own through `balanced_parts`: balanced whatever the number of full heads, its query,
    key and value read in place, and its sdpa outputs small enough to reuse heap memory rather than fault
    in fresh pages. Otherwise one sdpa call over the gathered heads.
    """
    groups = query.shape[1] // key.shape[1]
    n = query.shape[2]
    cpu = query.device.type == "cpu" and query.dtype == torch.float32
    if (
        mask is None
        and cpu
        and n >= BALANCED_MIN
        and balance_pays(query.shape[0], n, torch.get_num_threads())
    ):
        for head in heads.tolist():
            j = head // groups
            lower, upper = balanced_parts(
                query[:, head : head + 1], key[:, j : j + 1], value[:, j : j + 1], scale
            )
            h = lower.shape[2]
            out[:, :h, head] = lower[:, 0]
            out[:, h:, head] = upper[:, 0]
        return
    kv = torch.div(heads, groups, rounding_mode="floor")
    q, k, v = query.index_select(1, heads), key.index_select(1, kv), value.index_select(1, kv)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale)
    out.index_copy_(2, heads, o.transpose(1, 2))
