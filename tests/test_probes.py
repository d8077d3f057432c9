"""The RAM probe's batched row computation against an independent row-by-row reference (fp64, per head)."""

from __future__ import annotations

import pytest
import torch

from corelens.attention import probes
from corelens.attention.dispatch import AttentionCall
from corelens.attention.probes import RamProbe

SHAPES = [  # (heads, kv_heads, n, rows)
    (4, 4, 37, 5),
    (8, 2, 64, 9),  # GQA, 4 query heads per KV head
    (6, 1, 129, 32),  # every query head on one KV head
]


def _call(heads, kv_heads, n, dtype, mask_kind, seed=0):
    g = torch.Generator().manual_seed(seed)
    dim = 16
    query = torch.randn(1, heads, n, dim, generator=g).to(dtype)
    key = torch.randn(1, kv_heads, n, dim, generator=g).mul(2).to(dtype)
    value = torch.zeros(1, kv_heads, n, dim, dtype=dtype)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    pad = n // 5  # left padding: keys before `pad` are hidden from every row
    mask = None
    if mask_kind != "causal":
        mask = causal.clone()
        mask[:, :pad] = False
        mask = mask[None, None]
        if mask_kind == "float":
            mask = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, torch.finfo(dtype).min)
    return AttentionCall(None, 1, query, key, value, mask, dim**-0.5)


def _reference(call, rows, sets):
    """Per row and head: fp64 scores of the head's KV head, the mask, softmax, mass on each set; then mean."""
    heads, n = call.query.shape[1], call.key.shape[2]
    groups = heads // call.key.shape[1]
    out = torch.zeros(heads, len(sets), dtype=torch.float64)
    for r in rows.tolist():
        for h in range(heads):
            scores = call.key[0, h // groups].double() @ call.query[0, h, r].double() * call.scaling
            if call.attention_mask is None:
                allowed = torch.arange(n) <= r
            elif call.attention_mask.dtype == torch.bool:
                allowed = call.attention_mask[0, 0, r]
            else:
                allowed = call.attention_mask[0, 0, r] == 0
            probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=0)
            for i, tokens in enumerate(sets):
                out[h, i] += probs[tokens].sum()
    return out / len(rows)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask_kind", ["causal", "bool", "float"])
@pytest.mark.parametrize("budget", ["one row", "three rows", "all rows"])
def test_batched_rows_equal_the_row_by_row_reference(monkeypatch, shape, dtype, mask_kind, budget):
    heads, kv_heads, n, n_rows = shape
    per_row = 4 * heads * n
    bytes_ = {"one row": per_row, "three rows": 3 * per_row + 1, "all rows": 1 << 30}[budget]
    monkeypatch.setattr(probes, "chunk_bytes", lambda device: bytes_)
    monkeypatch.setattr(probes, "_KEY_BLOCK_BYTES", 4 * (16 + 32) * 5)  # a bf16 K upcast a few keys at a time
    call = _call(heads, kv_heads, n, dtype, mask_kind, seed=n)
    rows = torch.arange(n - n_rows, n)
    omega, visual = torch.arange(n // 3, n // 2), torch.arange(n // 4, 3 * n // 4)
    views = [torch.arange(n // 4, n // 2), torch.arange(n // 2, 3 * n // 4)]
    probe = RamProbe(3, heads, rows, omega, visual, n, views=views)
    probe.pre(call)
    in_omega = set(omega.tolist())
    sets = [omega, visual]
    for view in views:
        sets += [view, torch.tensor([t for t in view.tolist() if t in in_omega], dtype=torch.long)]
    want = _reference(call, rows, sets).float()
    got = torch.cat([probe.mass[1, :, None], probe.visual_mass[1, :, None], probe.view_mass[1].flatten(1)], 1)
    assert (got - want).abs().max().item() <= 2e-6
    assert probe.mass[[0, 2]].isnan().all()  # other layers untouched


def test_cpu_budget_is_the_former_bound_and_cuda_budget_follows_free_memory(monkeypatch):
    cpu = torch.device("cpu")
    for heads, n in ((16, 128), (28, 32768), (16, 131072)):
        assert probes.rows_per_chunk(heads, n, probes.chunk_bytes(cpu)) == max(1, 2**20 // (heads * n))
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 3 << 30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 2 << 30)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (79 << 30, 80 << 30))
    assert probes.chunk_bytes(cuda) == probes.CUDA_CHUNK_BYTES  # plenty free: the documented default
    assert probes.rows_per_chunk(28, 32768, probes.chunk_bytes(cuda)) >= 32  # 32 rows at 32k: one chunk
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (7 << 20, 80 << 30))
    assert probes.chunk_bytes(cuda) == ((7 << 20) + (1 << 30)) // 8  # an eighth of what is left


def test_a_half_precision_key_is_never_upcast_whole(monkeypatch):
    call = _call(8, 2, 64, torch.bfloat16, "causal")
    monkeypatch.setattr(probes, "_KEY_BLOCK_BYTES", 4 * 2 * (16 + 4 * 9) * 16)  # 16 keys per block
    upcast = []
    to_float = torch.Tensor.float

    def recording(tensor, *args, **kwargs):
        upcast.append(tuple(tensor.shape))
        return to_float(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "float", recording)
    probe = RamProbe(2, 8, torch.arange(55, 64), torch.arange(3, 9), torch.arange(2, 40), 64)
    probe.pre(call)
    keys = [shape for shape in upcast if shape[:2] == (1, 2) and shape[-1] == 16]
    assert keys and max(shape[2] for shape in keys) == 16  # blocks of 16 keys, never all 64


_HOST_READS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__")


def test_the_probe_loop_reads_nothing_back_until_the_layer_is_done(monkeypatch):
    call = _call(8, 2, 64, torch.float32, "bool")
    probe = RamProbe(2, 8, torch.arange(40, 64), torch.arange(3, 9), torch.arange(2, 40), 64)
    monkeypatch.setattr(probes, "chunk_bytes", lambda device: 4 * 8 * 64 * 5)  # five chunks of rows
    reads = []
    original = probes._softmax_

    def watched(scores):
        reads.append("chunk")
        return original(scores)

    def record_read(name):
        def record(*args, **kwargs):
            reads.append(name)
            return getattr(torch.Tensor, f"_orig_{name}")(*args, **kwargs)

        return record

    monkeypatch.setattr(probes, "_softmax_", watched)
    for name in _HOST_READS:
        monkeypatch.setattr(torch.Tensor, f"_orig_{name}", getattr(torch.Tensor, name), raising=False)
        monkeypatch.setattr(torch.Tensor, name, record_read(name))
    probe.pre(call)
    monkeypatch.undo()
    first = reads.index("chunk")  # before it, the range check of the host rows (host tensors only)
    assert reads[first:] == ["chunk"] * 5 + ["cpu"]  # then one copy to the host, after the last chunk


def test_one_probe_serves_two_prompts_from_their_contexts(tiny_dir, tmp_path):
    """A RamProbe and a KeyMapProbe built without positions, installed once, measure two prompts of different
    lengths (one probed at its answer rows, which the context carries) from each forward's context, and give
    exactly what probes built with each prompt's tensors give; without a context they say what they need."""
    import corelens
    from corelens.attention import activate
    from corelens.attention.probes import KeyMapProbe
    from corelens.attention.prompt_context import AttentionContext, attention_context
    from corelens.errors import CorelensError
    from corelens.models.prepare import prepare
    from corelens.organism.tasks import generate

    m = corelens.load(tiny_dir("qwen2_vl"))
    samples = [corelens.read_samples(generate(t, tmp_path / t, 1, seed=9))[0][0] for t in ("image", "video")]
    prompts = [prepare(m, samples[0], answer=samples[0].answer), prepare(m, samples[1])]
    cases = list(zip(samples, prompts, ["answer", "question"]))
    assert prompts[0].seq_len != prompts[1].seq_len
    heads = [(0, 1), (1, 3)]
    ram, keymap = RamProbe(m.num_layers, m.num_heads, views=True), KeyMapProbe(heads)
    got = []
    with torch.no_grad(), activate(m.layer_modules(), ram), activate(m.layer_modules(), keymap):
        for s, p, query in cases:
            omega = p.layout.omega(s.targets, sample=s.id)
            with attention_context(AttentionContext.of(p, omega=omega, query_rows=p.rows(query))):
                m.model(**p.to(m.device), use_cache=False, logits_to_keep=1)
            got.append((ram.mass, ram.visual_mass, ram.view_mass, keymap.maps))
    for (s, p, query), (mass, visual_mass, view_mass, maps) in zip(cases, got):
        rows, omega = (
            torch.from_numpy(p.rows(query)),
            torch.from_numpy(p.layout.omega(s.targets, sample=s.id)),
        )
        views = [torch.from_numpy(tokens) for _, tokens in p.layout.views()]
        old = RamProbe(
            m.num_layers, m.num_heads, rows, omega, torch.from_numpy(p.layout.visual), p.seq_len, views
        )
        old_maps = KeyMapProbe(heads, rows, p.seq_len)
        with torch.no_grad(), activate(m.layer_modules(), old), activate(m.layer_modules(), old_maps):
            m.model(**p.to(m.device), use_cache=False, logits_to_keep=1)
        assert not old.mass.isnan().any() and old.view_mass.numel() and old.mass.sum() > 0
        assert torch.equal(mass, old.mass) and torch.equal(visual_mass, old.visual_mass)
        assert torch.equal(view_mass, old.view_mass)
        assert maps.keys() == old_maps.maps.keys() == set(heads)
        assert all(torch.equal(maps[h], old_maps.maps[h]) for h in heads)
    assert not torch.equal(got[0][0], got[1][0])  # two prompts, two measurements
    for probe in (RamProbe(m.num_layers, m.num_heads), KeyMapProbe(heads)):
        no_context = pytest.raises(CorelensError, match="probe needs the prompt's positions")
        with no_context, torch.no_grad(), activate(m.layer_modules(), probe):
            m.model(**prompts[1].to(m.device), use_cache=False, logits_to_keep=1)
