"""The one mask rule (docs/methods.md#hybrid): every kernel keeps exactly the (query, key) pairs it keeps.

The rule is written out here once more, literally, as the oracle: the dense reference, FlexAttention's
mask_mod (evaluated on index grids, no compile) and the coverage of every CPU tile path must equal it,
exhaustively for small prompts (every sink, window and prompt length) and on random larger cases.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from corelens.attention.kernels import Pattern, blocked, reference, tiles
from corelens.attention.kernels.flexattn import block_mask
from corelens.attention.kernels.masks import evaluate, hybrid_mask_function, row_starts

pytestmark = pytest.mark.e2e  # end to end: `make check` leaves this file out

FULL = torch.tensor([False, True, False])  # three query heads on one KV head: stream, full, stream


def documented(n, sink, window, model):
    """(batch, heads, n, n) booleans of the documented rule: j <= i and (full or j - s < S or i - j < W), AND the mask.

    s: the row's first real position, the first key its last query may attend.
    """
    out = []
    for b in range(model.shape[0]):
        last = model[b, 0, -1].tolist()
        s = last.index(True) if True in last else 0
        ok = model[b, 0].tolist()
        out.append(
            [
                [
                    [j <= i and (full or j - s < sink or i - j < window) and ok[i][j] for j in range(n)]
                    for i in range(n)
                ]
                for full in FULL.tolist()
            ]
        )
    return torch.tensor(out, dtype=torch.bool)


def model_mask(n, pads, holes=None):
    """A causal mask with left padding `pads` per batch row, minus `holes` (a right-padding-like general mask)."""
    keep = torch.ones(len(pads), n, dtype=torch.bool)
    for row, pad in enumerate(pads):
        keep[row, :pad] = False
    mask = torch.ones(n, n, dtype=torch.bool).tril()[None, None] & keep[:, None, None, :]
    return mask if holes is None else mask & holes


def coverage(kernel, mask, model, pattern, **options):
    """Return (batch, heads, n, n) booleans: the pairs `kernel` gives weight, read off one-hot values.

    Zero queries make every kept key's score equal, so output row i is the mean of the one-hot values of
    the keys it keeps: positive exactly there.
    """
    batch, n = mask.shape[0], mask.shape[-1]
    q = torch.zeros(batch, len(FULL), n, n)
    k = torch.randn(batch, 1, n, n, generator=torch.Generator().manual_seed(n))
    v = torch.eye(n).expand(batch, 1, n, n).contiguous()
    return (kernel(q, k, v, model, FULL, pattern, 1.0, **options) > 1e-6).transpose(1, 2)


def check(n, sink, window, pads, holes=None):
    """Assert that the rule and every kernel keep exactly the documented pairs; name every one that does not."""
    pattern = Pattern(sink, window)
    mask = model_mask(n, pads, holes)
    want = documented(n, sink, window, mask)
    model = None if holes is None and not any(pads) else mask
    got = {}

    # The rule itself, as the kernels evaluate it.
    positions = torch.arange(n).expand(len(pads), n)
    starts = row_starts(mask, len(pads), mask.device)
    rule = hybrid_mask_function(pattern, FULL, starts, model)
    got["the rule"] = evaluate(rule, positions, positions, heads=len(FULL)) & mask

    got["the dense reference"] = coverage(reference, mask, model, pattern)

    # FlexAttention's mask_mod, as its block mask carries it, on index grids.
    mod = block_mask(FULL, model, n, pattern, torch.device("cpu"), compile_mask=False).mask_mod
    b, h = torch.arange(len(pads))[:, None, None, None], torch.arange(len(FULL))[None, :, None, None]
    got["the flex mask_mod"] = mod(b, h, positions[:, None, :, None], positions[:, None, None, :]) & mask

    # Every CPU path (tile heights: the default, 2 and 3 queries), or the dense general path.
    for path, block in itertools.product(tiles.PATHS, (None, 2, 3)):
        try:
            got[f"the {path} tiles (block {block})"] = coverage(
                blocked, mask, model, pattern, block=block, path=path
            )
        except ValueError as err:  # a tile layout that cannot hold the rule says so
            got[f"the {path} tiles (block {block}): {err}"] = None
    wrong = [
        name for name, keep in got.items() if keep is None or not torch.equal(keep.expand_as(want), want)
    ]
    assert not wrong, f"n={n}, S={sink}, W={window}, pads={pads}, holes={holes is not None}: {wrong}"


@pytest.mark.parametrize("n", range(1, 15))
def test_every_kernel_keeps_the_rule_exhaustively(n):
    for sink, window in itertools.product(range(4), range(1, 6)):
        check(n, sink, window, [0])
        check(n, sink, window, [0, min(2, n - 1)])  # a left-padded row beside an unpadded one


def test_every_kernel_keeps_the_rule_on_random_cases():
    rng = random.Random(0)
    for case in range(12):
        n = rng.randint(20, 70)
        sink, window = rng.randint(0, 8), rng.randint(1, 20)
        pads = [0, rng.randint(0, n - 1)]
        holes = None
        if case % 3 == 2:  # any other mask: the dense general path
            holes = torch.rand(2, 1, n, n, generator=torch.Generator().manual_seed(case)) < 0.8
        check(n, sink, window, pads, holes)
