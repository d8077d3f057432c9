"""eRank, RID, TME, MixIG against their float64 definitions (full SVD, dense S x S), on awkward matrices."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from corelens.bench.flow_metrics import direct_metrics, direct_tme, make_states
from corelens.metrics import erank, mixig, rid, rid_terms, singular_values, spectrum, tme
from corelens.metrics.spectra import FP32_EPS, kept_rank

RID_KEYS = ("rid", "dS", "dD", "dD_token", "dD_hidden", "erank_in", "erank_out")


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _low_rank(s: int, h: int, r: int, seed: int = 0) -> np.ndarray:
    rng = _rng(seed)
    return rng.standard_normal((s, r)) @ rng.standard_normal((r, h))


def awkward() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Return named (X, X') pairs: shapes on both sides of S = H and every degenerate case the brief lists."""
    rng = _rng(1)
    cases = {}
    x = rng.standard_normal((90, 60))
    cases["tall"] = (x, x + 0.3 * rng.standard_normal(x.shape))
    x = rng.standard_normal((50, 80))
    cases["wide"] = (x, x + 0.3 * rng.standard_normal(x.shape))
    x = _low_rank(70, 50, 12)
    cases["rank-deficient tall"] = (x, x + 0.2 * rng.standard_normal(x.shape))
    x = _low_rank(40, 90, 9, seed=2)
    cases["rank-deficient wide"] = (x, x + 0.2 * rng.standard_normal(x.shape))
    mix = rng.standard_normal((70, 70)) / 10
    cases["update inside the row space"] = (
        cases["rank-deficient tall"][0],
        (np.eye(70) + mix) @ _low_rank(70, 50, 12),
    )
    x = rng.standard_normal((80, 64))
    x[0] *= 1e4  # an attention sink: one row 10^4 x the others
    cases["sink row"] = (x, x + rng.standard_normal(x.shape))
    x = rng.standard_normal((60, 48))
    x[30:] = x[:30]  # every row twice
    cases["duplicate rows"] = (x, x + 0.1 * rng.standard_normal(x.shape))
    x = rng.standard_normal((64, 40))
    cases["all-zero update"] = (x, x.copy())
    x = _low_rank(64, 40, 7, seed=3)
    cases["all-zero update, rank-deficient"] = (x, x.copy())
    x = rng.standard_normal((48, 48))
    cases["square"] = (x, x @ rng.standard_normal((48, 48)) / 7)
    return cases


CASES = awkward()


@pytest.mark.parametrize("method", ["auto", "gram", "svd"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_rid_matches_full_svd(name, method):
    x, x_new = CASES[name]
    want = direct_metrics(x, x_new, eps=FP32_EPS)
    got = rid_terms(x, x_new, eps=FP32_EPS, method=method)
    assert got.rank == want["rank"]
    for key in RID_KEYS:
        assert getattr(got, key) == pytest.approx(want[key], rel=1e-6, abs=1e-9), key
    assert 0.0 <= got.rid <= 2.0


def test_rid_special_values():
    x, same = CASES["all-zero update"]
    t = rid_terms(x, same)
    # Full rank, zero update: nothing new. dD is exactly 0 (no direction leaves the support); dS compares two
    # eRanks of the same matrix reached by two eigen routines (SymEig for the input, eigvalsh for the output),
    # which agree to rounding (seen: 5.3e-16).
    assert t.dD == 0.0 and t.dS == pytest.approx(0.0, abs=1e-12) and t.rid == pytest.approx(0.0, abs=1e-12)
    inside = CASES["update inside the row space"]
    assert rid_terms(*inside, eps=FP32_EPS).dD_hidden == pytest.approx(0.0, abs=1e-9)
    zero = np.zeros((20, 10))
    assert erank(zero) == 0.0
    t = rid_terms(zero, _rng().standard_normal((20, 10)))
    assert t.rank == 0 and t.dD == pytest.approx(1.0)  # nothing is inside an empty support
    assert rid_terms(zero, zero).rid == 0.0


# Kept rank of a rank-12 70 x 50 matrix plus 1e-9 noise (σ_13 / σ_1 = 1.6e-10): the fp32 threshold
# 70 · 1.19e-7 drops the noise, the fp64 one (70 · 2.2e-16) keeps all 50 directions; 90 % of Σσ²: 9.
RANKS = {("numerical", "fp32"): 12, ("numerical", "fp64"): 50, ("energy", "fp32"): 9, ("energy", "fp64"): 9}


@pytest.mark.parametrize(("rule", "precision"), sorted(RANKS))
def test_rank_rules_and_eps(rule, precision):
    x, x_new = CASES["rank-deficient tall"]
    x = x + 1e-9 * _rng(5).standard_normal(x.shape)  # tiny, real (not rounding) directions
    eps = FP32_EPS if precision == "fp32" else float(np.finfo(np.float64).eps)
    got = rid_terms(x, x_new, rank=rule, eps=eps, energy=0.9)
    assert got.rank == RANKS[rule, precision]
    want = direct_metrics(x, x_new, rank=rule, eps=eps, energy=0.9)
    assert got.rid == pytest.approx(want["rid"], rel=1e-6, abs=1e-9)
    sigma = torch.from_numpy(np.linalg.svd(x, compute_uv=False))
    assert kept_rank(sigma, x.shape) == 12 == np.linalg.matrix_rank(x.astype(np.float32))  # numpy's rule
    assert rid_terms(x.astype(np.float32), x_new.astype(np.float32)).rank == 12  # eps from the input dtype
    # σ_2 = 7e-6 lies between 50 · eps (5.96e-6) and 70 · eps (8.34e-6): the threshold takes max(S, H).
    assert kept_rank(torch.tensor([1.0, 7e-6], dtype=torch.float64), (50, 70)) == 1


def test_inputs_numpy_or_torch_and_erank_definition():
    x, x_new = CASES["wide"]
    a = rid(x, x_new)
    b = rid(torch.from_numpy(x), torch.from_numpy(x_new))
    assert a == pytest.approx(b, rel=1e-12)
    assert a.rid == pytest.approx(a.dS + a.dD)
    sigma = np.linalg.svd(x, compute_uv=False)
    p = sigma / sigma.sum()
    assert erank(x) == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-12)
    np.testing.assert_allclose(singular_values(x, method="gram"), sigma, rtol=1e-10)
    assert erank(np.eye(7)) == pytest.approx(7.0)
    assert erank(np.outer(np.arange(1.0, 6.0), np.ones(4))) == pytest.approx(1.0)


def test_exact_zero_singular_values_stay_zero():
    x = _low_rank(200, 120, 5, seed=7)
    sigma = spectrum(x, method="gram").sigma.numpy()
    assert sigma[5:].max() < 1e-10 * sigma[0]  # sqrt of the Gram's noise would be ~1e-8 of the top value
    assert erank(x, method="gram") == pytest.approx(erank(x, method="svd"), rel=1e-9)


@pytest.mark.parametrize("name", ["tall", "wide", "sink row", "duplicate rows", "rank-deficient wide"])
def test_tme_and_mixig_match_dense_similarity(name):
    x, x_new = CASES[name]
    assert tme(x) == pytest.approx(direct_tme(x), rel=1e-12)
    assert tme(x, block=7) == pytest.approx(direct_tme(x), rel=1e-12)  # blocks that do not divide S
    assert tme(x, rows="last") == pytest.approx(direct_tme(x, rows="last"), rel=1e-12)
    assert tme(x, alpha=8.0, block=16) == pytest.approx(direct_tme(x, alpha=8.0), rel=1e-12)
    want = direct_tme(x_new) - direct_tme(x)
    assert mixig(x, x_new) == pytest.approx(want, rel=1e-9, abs=1e-14)
    delta = direct_tme(x_new - x) - direct_tme(x)
    assert mixig(x, x_new, of="delta") == pytest.approx(delta, rel=1e-9, abs=1e-14)


def test_tme_torch_blocks_equal_numpy_blocks(monkeypatch):
    import corelens.metrics.mixing as mixing

    x = CASES["sink row"][0]
    want = [tme(x, block=b, alpha=a) for b in (7, 80) for a in (1.0, 8.0)]
    monkeypatch.setattr(mixing, "_NUMPY_ON_CPU", False)  # the path tensors on a GPU take
    got = [tme(x, block=b, alpha=a) for b in (7, 80) for a in (1.0, 8.0)]
    assert got == pytest.approx(want, rel=1e-13)


def test_tme_edge_cases():
    x = _rng().standard_normal((30, 5))
    x[4] = 0.0  # a zero row: cosine 0 with everything
    assert tme(x) == pytest.approx(direct_tme(x), rel=1e-12)
    same = np.tile(_rng().standard_normal((1, 6)), (10, 1))
    assert tme(same) == pytest.approx(1.0)  # all rows identical: every row uniform
    opposite = np.array([[1.0, 0.0], [-1.0, 0.0]])
    assert tme(opposite) == pytest.approx(0.0, abs=1e-12)  # W = 1 on itself, 0 on the other
    with pytest.raises(ValueError):
        tme(np.ones((1, 4)))


def test_realistic_states_gram_route():
    x, x_new = make_states(320, 256, seed=3)
    want = direct_metrics(x, x_new)
    got = rid_terms(x, x_new, method="gram")
    assert got.route == "gram"
    for key in RID_KEYS:
        assert getattr(got, key) == pytest.approx(want[key], rel=1e-6), key


def test_symeig_tridiagonal_ranges():
    from corelens.metrics.symeig import SymEig

    rng = _rng(4)
    a = rng.standard_normal((300, 280))
    a[:2] *= 300.0
    g = torch.from_numpy(a.T @ a)
    ref_values, ref_vectors = torch.linalg.eigh(g)
    eig = SymEig(g, "tridiagonal")
    np.testing.assert_allclose(eig.values, ref_values, rtol=0, atol=1e-13 * float(ref_values[-1]))
    for lo, hi in ((0, 280), (0, 17), (250, 280), (100, 101)):
        v = eig.vectors(lo, hi)
        residual = g @ v - v * eig.values[lo:hi]
        assert float(residual.abs().max()) < 1e-12 * float(ref_values[-1])
        assert float((v.T @ v - torch.eye(hi - lo, dtype=torch.float64)).abs().max()) < 1e-11
    diag = torch.diag(torch.arange(1.0, 301.0, dtype=torch.float64))  # reflectors are all identities (τ = 0)
    v = SymEig(diag, "tridiagonal").vectors(0, 300)
    assert float((v.abs() - torch.eye(300, dtype=torch.float64)).abs().max()) < 1e-12


@pytest.mark.parametrize("case", ["sinks", "rank-deficient", "few kept"])
def test_rid_large_side_tridiagonal_route(case):
    rng = _rng(6)
    if case == "sinks":
        x = rng.standard_normal((400, 300))  # 300 columns: the Gram is reduced to tridiagonal form
        x[:2] *= 1e4  # sinks push the bottom of the bulk under the fp32 rank threshold
        x_new = x + 0.5 * rng.standard_normal(x.shape)
    elif case == "rank-deficient":
        x = _low_rank(400, 300, 220, seed=6)
        x_new = x + 0.3 * rng.standard_normal(x.shape)
    else:
        x = _low_rank(300, 400, 40, seed=7)
        x_new = x + rng.standard_normal(x.shape)
    want = direct_metrics(x, x_new)
    got = rid_terms(x, x_new, eps=FP32_EPS)
    assert got.route == "gram" and got.rank == want["rank"] < min(x.shape)
    for key in RID_KEYS:
        assert getattr(got, key) == pytest.approx(want[key], rel=1e-6, abs=1e-9), key


def test_top_heads_rounds_a_share_to_at_least_one_head():
    import pandas as pd

    from corelens.metrics.ram import top_heads

    table = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "rank": [3, 1, 4, 2]})
    assert top_heads(table, 0.01) == [(0, 1)]  # 1 % of 4 heads rounds to 0: one head, as head sets do
    assert top_heads(table, 0.5) == [(0, 1), (1, 1)]
    assert top_heads(table, 3) == [(0, 1), (1, 1), (0, 0)]
