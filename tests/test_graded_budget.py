"""Graded budgets (`corelens.policies.GradedBudget`) against eager attention with the dropped keys masked."""

from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

import corelens
from corelens.errors import OptionError
from corelens.models.tiny import load_tiny
from corelens.policies import POLICIES, Policy
from corelens.policies.graded_budget import GradedBudget, allocate, kv_scores

N, ROWS, SINK, NEW = 40, 6, 3, 4
SCORES = (
    (0, 0, 5.0),
    (0, 1, 1.0),
    (0, 2, 0.0),
    (0, 3, 2.0),
    (1, 0, 0.5),
    (1, 1, 0.5),
    (1, 2, 9.0),
    (1, 3, 0.0),
)


def _budgets(budget, floor, kv_heads=2, groups=2):
    """Each KV head's keys, written out: query scores summed per group, floor + proportional share, rounded."""
    kv = [
        sum(s for layer_, h, s in SCORES if layer_ == layer and h // groups == g)
        for layer in (0, 1)
        for g in range(kv_heads)
    ]
    total = budget * len(kv) * N
    each = floor * total / len(kv)
    return [min(N, max(1, round(each + (total - each * len(kv)) * s / sum(kv)))) for s in kv]


class Reference:
    """Eager attention (`repeat_kv`, softmax) with an explicit per-head mask; nothing from corelens."""

    def __init__(self, select, budgets):
        self.select, self.budgets, self.kept = select, budgets, {}

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        layer, groups = module.layer_idx, query.shape[1] // key.shape[1]
        k = key.repeat_interleave(groups, 1)
        v = value.repeat_interleave(groups, 1)
        q_len, k_len = query.shape[2], key.shape[2]
        weights = (query @ k.transpose(-1, -2)) * scaling
        q_pos = torch.arange(k_len - q_len, k_len)[:, None]
        causal = torch.arange(k_len)[None, :] <= q_pos
        if q_len == k_len:  # the prefill: choose each KV head's kept prompt keys
            kept = torch.zeros(key.shape[1], N, dtype=torch.bool)
            probs = torch.softmax(weights.masked_fill(~causal, float("-inf")), -1)[0]
            for h in range(key.shape[1]):
                b = self.budgets[layer * key.shape[1] + h]
                if self.select == "sink+window":
                    kept[h, : min(SINK, b)] = True
                    kept[h, N - max(b - SINK, 0) :] = True
                else:
                    kept[h, N - min(ROWS, b) :] = True
                    votes = probs[h * groups : (h + 1) * groups, N - ROWS :, : N - ROWS].sum(dim=(0, 1))
                    if b > ROWS:
                        kept[h, votes.argsort(descending=True)[: b - ROWS]] = True
            self.kept[layer] = kept
        keys = torch.ones(key.shape[1], k_len, dtype=torch.bool)
        keys[:, :N] = self.kept[layer]
        reads = q_pos >= N - ROWS
        mask = causal & (~reads | keys.repeat_interleave(groups, 0)[:, None])
        weights = torch.softmax(weights.masked_fill(~mask, float("-inf")), dim=-1)
        return (weights @ v).transpose(1, 2).contiguous(), weights


@pytest.mark.parametrize("select", ["sink+window", "top"])
def test_graded_budget_is_dense_attention_with_the_dropped_keys_masked(tiny_dir, select):
    path = tiny_dir("qwen2_5_vl")
    m = corelens.load(path)  # 2 layers x 4 query heads over 2 KV heads
    policy = GradedBudget(SCORES, budget=0.3, floor=0.25, select=select, sink=SINK, rows=ROWS)
    budgets = _budgets(0.3, 0.25)
    assert len(set(budgets)) > 2 and max(budgets) < N  # graded, and every head drops keys

    reference = Reference(select, budgets)
    AttentionInterface.register("graded_reference", reference)
    AttentionMaskInterface.register("graded_reference", sdpa_mask)
    stock, _ = load_tiny(path, {"": "sdpa", "text_config": "graded_reference", "vision_config": "sdpa"})
    ids = torch.randint(20, 60, (1, N), generator=torch.Generator().manual_seed(4))
    gen = {"max_new_tokens": NEW, "do_sample": False, "output_scores": True, "return_dict_in_generate": True}
    with torch.no_grad():
        ref = stock.generate(input_ids=ids, **gen)
        with policy.applied(m) as on:
            out = m.model.generate(input_ids=ids, **gen)
            report = policy.report(on)
        dense = m.model.generate(input_ids=ids, **gen)
    for a, b in zip(out.scores, ref.scores):
        assert (a - b).abs().max().item() <= 1e-4
    assert max((a - b).abs().max().item() for a, b in zip(out.scores, dense.scores)) > 1e-3  # it bites
    assert report["cache_kept_fraction"] == pytest.approx(sum(budgets) / (4 * N))
    assert report["kv_bytes_kept"] == sum(budgets) * 2 * 16 * 4  # K and V, head_dim 16, fp32


def test_budgets_follow_the_scores_and_the_policy_is_plain_data():
    table = kv_scores(SCORES, 2, 4, 2)
    assert table.tolist() == [[6.0, 2.0], [1.0, 9.0]]
    assert allocate(table, 0.3, 0.25, N).tolist() == [_budgets(0.3, 0.25)[:2], _budgets(0.3, 0.25)[2:]]
    uniform = allocate(table, 0.3, 1.0, N)  # floor 1: every head the same budget, whatever its score
    # One head's share above the prompt: the cap's leftover goes to the others by score, the total kept.
    skewed = allocate(torch.tensor([[50.0, 1.0], [1.0, 0.0]]), 0.6, 0.1, N)
    assert (
        skewed[0, 0] == N
        and skewed.sum() == round(0.6 * 4 * N)
        and skewed[0, 1] == skewed[1, 0] > skewed[1, 1]
    )
    assert uniform.unique().tolist() == [12]
    policy = GradedBudget(SCORES, budget=0.3, select="top")
    assert Policy.from_json(policy.to_json()) == policy and POLICIES["graded"] is GradedBudget
    with pytest.raises(OptionError, match="unknown select"):
        GradedBudget(SCORES, select="random")
