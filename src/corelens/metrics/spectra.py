"""Singular spectra of residual states (docs/methods.md#erank-and-rid): eRank, numerical rank, and RID = ΔS + ΔD.

Everything runs in float64 on the device of the input. The default route never forms an SVD: it takes the
Gram matrix of the matrix's small side (S x S or H x H, whichever is smaller) and its eigenvalues, and
reaches the support terms of ΔD through n x n products:
- kept rank r = n: a Cholesky solve, no eigenvectors;
- r ≥ n/2: the eigenvectors of the n − r discarded directions only (`SymEig`: one tridiagonal reduction,
  MRRR for the range, blocked back-transformation), and a Cholesky solve of the Gram with its discarded
  eigenvalues lifted to σ_r², so the kept eigenvectors are never formed;
- r < n/2 (e.g. a state dominated by a few sinks): the r kept eigenvectors.
Where the Gram route is inexact it is repaired, not trusted:
- eigenvalues of the Gram below `_REFINE_BELOW` of the largest carry absolute noise of about ε·λ_max, so
  their singular values are recomputed as ‖Z v_i‖ from the eigenvectors (exact zeros stay near zero);
- projections onto the kept column space lose about ε·κ_r² (κ_r = σ_1 / σ_r) through the Gram; when that
  exceeds `_GRAM_TOL`, 'auto' computes the input's spectrum with an SVD instead. With the fp32 rank
  threshold of docs/methods.md#erank-and-rid, κ_r ≤ 1 / (max(S, H)·1.19e-7), so captured states stay on the Gram route;
- cancellations are arranged around the update ΔX = X' − X (not around X'), so an all-zero update gives an
  exactly zero support change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from corelens.errors import OptionError
from corelens.metrics.symeig import SymEig

FP32_EPS = float(np.finfo(np.float32).eps)
RANK_RULES = ("numerical", "energy")
SPECTRUM_METHODS = ("auto", "gram", "svd")

_REFINE_BELOW = 1e-10  # λ / λ_max under which sqrt(λ) from the Gram is noise-dominated
_GRAM_TOL = 1e-6  # ε64 · κ_r² above which Gram-route projections are not trusted ('auto' → SVD)
_SMALL_SIDE = 32  # 'auto' takes an SVD below this many columns: exact and as cheap as anything
_EPS64 = float(np.finfo(np.float64).eps)


def as_float64(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Return a 2-D numpy array or torch tensor as a float64 torch tensor (on the tensor's device)."""
    t = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))
    if t.dim() != 2:
        raise ValueError(f"expected a 2-D matrix (tokens x hidden), got shape {tuple(t.shape)}")
    return t.detach().to(torch.float64)


def dtype_eps(x: np.ndarray | torch.Tensor) -> float:
    """Return the machine epsilon of the input's dtype (fp32's for non-float inputs)."""
    if isinstance(x, torch.Tensor):
        return torch.finfo(x.dtype).eps if x.dtype.is_floating_point else FP32_EPS
    dtype = np.asarray(x).dtype
    return float(np.finfo(dtype).eps) if np.issubdtype(dtype, np.floating) else FP32_EPS


def gram(z: torch.Tensor) -> torch.Tensor:
    """Return zᵀz in float64 (numpy's symmetric rank-k update on CPU: half the flops of a product)."""
    if z.device.type == "cpu":
        a = z.numpy()
        return torch.from_numpy(a.T @ a)
    return z.T @ z


@dataclass(frozen=True)
class Spectrum:
    """The singular spectrum of one state matrix X (S x H), held for its tall orientation Z (m >= n).

    `sigma` is descending; `right_vectors(lo, hi)` returns the right singular vectors of Z (eigenvectors of
    its Gram) for descending positions [lo, hi), computed on first request.
    """

    tall: torch.Tensor  # fp64, m x n: X itself when S >= H, else Xᵀ
    transposed: bool
    sigma: torch.Tensor  # n singular values, descending
    route: str  # "gram" or "svd"
    gram: torch.Tensor | None = None  # ZᵀZ (gram route)
    eig: SymEig | None = None  # eigendecomposition of the Gram (gram route)
    order: torch.Tensor | None = None  # ascending eigen index of each descending position (gram route)
    vectors: torch.Tensor | None = None  # n x n right singular vectors (svd route)
    left: torch.Tensor | None = None  # m x n left singular vectors (svd route)

    @property
    def shape(self) -> tuple[int, int]:
        """Return (S, H) of the original state."""
        m, n = self.tall.shape
        return (n, m) if self.transposed else (m, n)

    def erank(self) -> float:
        """Return the effective rank exp(H(σ / Σσ)) (0 for an all-zero matrix)."""
        return erank_of(self.sigma)

    def rank(self, rule: str = "numerical", eps: float = FP32_EPS, energy: float = 0.99) -> int:
        """Return the number of kept directions r under `rule` (docs/methods.md#erank-and-rid)."""
        return kept_rank(self.sigma, self.shape, rule=rule, eps=eps, energy=energy)

    def right_vectors(self, lo: int, hi: int) -> torch.Tensor:
        """Return the right singular vectors of descending positions [lo, hi) as columns (n x (hi − lo))."""
        if self.vectors is not None:
            return self.vectors[:, lo:hi]
        wanted = self.order[lo:hi]
        if not len(wanted):
            return torch.zeros(self.tall.shape[1], 0, dtype=torch.float64, device=self.tall.device)
        first, last = int(wanted.min()), int(wanted.max()) + 1
        return self.eig.vectors(first, last)[:, (wanted - first).to(self.tall.device)]


def _orient(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    s, h = x.shape
    return (x, False) if s >= h else (x.T.contiguous(), True)


def _svd_spectrum(z: torch.Tensor, transposed: bool) -> Spectrum:
    u, s, vh = torch.linalg.svd(z, full_matrices=False)
    return Spectrum(z, transposed, s, "svd", vectors=vh.T, left=u)


def _gram_spectrum(
    z: torch.Tensor, transposed: bool, *, vectors: bool = True, eig_method: str = "auto"
) -> Spectrum:
    g = gram(z)
    if eig_method == "auto" and not vectors and z.device.type == "cpu":
        eig_method = (
            "eigvalsh"  # eigenvalues only: one library call, the tridiagonal form only if needed later
        )
    eig = SymEig(g, eig_method)
    n = g.shape[0]
    lam = eig.values.flip(0)
    order = torch.arange(n - 1, -1, -1)
    top = float(lam[0]) if n else 0.0
    sigma = lam.clamp(min=0).sqrt()
    noisy = int((lam < _REFINE_BELOW * top).sum()) if top > 0 else 0
    if noisy:
        # sqrt of a noise-level eigenvalue is ~sqrt(ε)·σ_max; the norm of Z along its eigenvector is ~ε·σ_max.
        sigma[n - noisy :] = torch.linalg.vector_norm(z @ eig.vectors(0, noisy).flip(1), dim=0)
        resort = torch.argsort(sigma, descending=True, stable=True)
        sigma, order = sigma[resort], order[resort.cpu()]
    return Spectrum(z, transposed, sigma, "gram", gram=g, eig=eig, order=order)


def spectrum(x: np.ndarray | torch.Tensor, *, method: str = "auto", vectors: bool = True) -> Spectrum:
    """Return the singular spectrum of a state matrix (float64; `method` 'auto', 'gram' or 'svd').

    `vectors=False` says singular vectors will probably not be asked for (an output state whose spectrum
    only gives its eRank): the CPU then takes the faster eigenvalue-only routine first.
    """
    if method not in SPECTRUM_METHODS:
        raise OptionError(f"unknown spectrum method {method!r}; expected one of {SPECTRUM_METHODS}")
    z, transposed = _orient(as_float64(x))
    if method == "svd" or (method == "auto" and z.shape[1] < _SMALL_SIDE):
        return _svd_spectrum(z, transposed)
    return _gram_spectrum(z, transposed, vectors=vectors)


def singular_values(x: np.ndarray | torch.Tensor, *, method: str = "auto") -> np.ndarray:
    """Return the min(S, H) singular values of a matrix, descending (float64).

    Examples:
        >>> singular_values(np.diag([3.0, 4.0]))
        array([4., 3.])
    """
    return spectrum(x, method=method).sigma.cpu().numpy()


def erank_of(sigma: torch.Tensor) -> float:
    """Return exp(−Σ p log p) with p = σ / Σσ (0 when every σ is 0)."""
    total = sigma.sum()
    if float(total) <= 0:
        return 0.0
    p = sigma / total
    return float(torch.exp(-torch.special.xlogy(p, p).sum()))


def erank(x: np.ndarray | torch.Tensor, *, method: str = "auto") -> float:
    """Return the effective rank (Roy & Vetterli) of a matrix, on its singular values (not their squares).

    Examples:
        >>> round(erank(np.eye(4)), 3), round(erank(np.outer([1.0, 2.0, 3.0], [1.0, 1.0])), 3)
        (4.0, 1.0)
        >>> round(erank(np.diag([3.0, 1.0])), 3)  # p = (0.75, 0.25)
        1.755
    """
    return spectrum(x, method=method).erank()


def kept_rank(
    sigma: torch.Tensor,
    shape: tuple[int, int],
    *,
    rule: str = "numerical",
    eps: float = FP32_EPS,
    energy: float = 0.99,
) -> int:
    """Return r: σ_i > max(S, H)·eps·σ_max ('numerical'), or the fewest σ holding `energy` of Σσ² ('energy').

    Examples:
        >>> sigma = torch.tensor([4.0, 1.0, 1e-9])
        >>> kept_rank(sigma, (16, 3)), kept_rank(sigma, (16, 3), rule="energy", energy=0.9)
        (2, 1)
    """
    if rule not in RANK_RULES:
        raise OptionError(f"unknown rank rule {rule!r}; expected one of {RANK_RULES}")
    if sigma.numel() == 0 or float(sigma[0]) <= 0:
        return 0
    if rule == "numerical":
        return int((sigma > max(shape) * eps * sigma[0]).sum())
    if not 0.0 < energy <= 1.0:
        raise OptionError(f"energy must be in (0, 1], got {energy}")
    share = torch.cumsum(sigma**2, 0) / (sigma**2).sum()
    return min(int((share < energy).sum()) + 1, sigma.numel())


class Rid(NamedTuple):
    """RID of one update and its two parts."""

    rid: float
    dS: float
    dD: float


@dataclass(frozen=True)
class RidTerms:
    """RID with everything it is made of (docs/methods.md#erank-and-rid)."""

    rid: float
    dS: float
    dD: float
    dD_token: float  # ‖(I − P_C) X'‖_F / (2‖X'‖_F): the token-side (column space) share
    dD_hidden: float  # ‖X' (I − P_R)‖_F / (2‖X'‖_F): the hidden-side (row space) share
    erank_in: float
    erank_out: float
    rank: int  # kept directions r of X
    route: str  # how the support of X was computed: "gram" or "svd"


def _kept_projection(
    spec: Spectrum, r: int, v_rest: torch.Tensor, rest_m: torch.Tensor, m_cross: torch.Tensor
) -> float:
    """Return ‖U_rᵀΔZ‖² = Σ_{i≤r} ‖v_iᵀ ZᵀΔZ‖² / λ_i without the kept eigenvectors.

    The discarded eigenvalues of the Gram are lifted to μ = λ_r, so that G̃ = G + V_c (μ − Λ_c) V_cᵀ is as
    well conditioned as the kept spectrum; then ‖L̃⁻¹ M‖² counts the kept directions plus ‖V_cᵀ M‖² / μ.
    """
    lam = spec.eig.values[spec.order.to(spec.eig.values.device)]
    mu = float(lam[r - 1])
    g_lift = spec.gram + (v_rest * (mu - lam[r:])) @ v_rest.T
    chol, info = torch.linalg.cholesky_ex(g_lift)
    if int(info) != 0:
        raise np.linalg.LinAlgError("the lifted Gram is not positive definite")
    w = torch.linalg.solve_triangular(chol, m_cross, upper=False)
    return float((w * w).sum()) - float((rest_m * rest_m).sum()) / mu


def _support_outside(spec: Spectrum, z_new: torch.Tensor, r: int) -> tuple[float, float]:
    """Return (‖(I − P_big) Z'‖², ‖Z' (I − P_small)‖²) for the tall orientation, kept rank r."""
    z = spec.tall
    m, n = z.shape
    if spec.route == "svd":
        u, v = spec.left[:, :r], spec.vectors[:, :r]
        big = z_new - u @ (u.T @ z_new)
        small = z_new - (z_new @ v) @ v.T
        return float((big * big).sum()), float((small * small).sum())
    delta = z_new - z
    delta2 = float((delta * delta).sum())
    m_cross = z.T @ delta  # n x n: every big-side quantity below goes through it
    if r == n:
        chol, info = torch.linalg.cholesky_ex(spec.gram)
        if int(info) == 0:
            w = torch.linalg.solve_triangular(chol, m_cross, upper=False)
            # ‖(I − P_C) Z'‖² = ‖ΔZ‖² − ‖L⁻¹ ZᵀΔZ‖²: exact zero for a zero update.
            return max(delta2 - float((w * w).sum()), 0.0), 0.0
    sigma = spec.sigma
    if n - r <= r:
        v_rest = spec.right_vectors(r, n)
        rest_m = v_rest.T @ m_cross
        # (I − P_C)Z' = Z_rest + (I − P_C)ΔZ; the cross term is Σ_{i>r} v_iᵀ ZᵀΔZ v_i.
        cross = float((rest_m * v_rest.T).sum())
        outside = z_new @ v_rest
        small = float((outside * outside).sum())
        projected2 = _kept_projection(spec, r, v_rest, rest_m, m_cross)
    else:
        # Few kept directions (e.g. a state dominated by sinks): the same sums through the kept ones.
        v_kept = spec.right_vectors(0, r)
        kept_m = v_kept.T @ m_cross
        cross = float(torch.trace(m_cross)) - float((kept_m * v_kept.T).sum())
        # Z'(I − P_R) formed explicitly (m·n·r, as cheap as the projection): ‖Z'‖² − ‖Z'V‖² would lose
        # sqrt(ε)·‖Z'‖ to cancellation when Z' lies (almost) inside the kept row space.
        outside = z_new - (z_new @ v_kept) @ v_kept.T
        small = float((outside * outside).sum())
        projected = kept_m / sigma[:r, None]  # U_rᵀ ΔZ
        projected2 = float((projected * projected).sum())
    rest = float((sigma[r:] ** 2).sum()) + 2.0 * cross
    big = max(rest + delta2 - projected2, 0.0)
    return big, small


def rid_terms(
    x: np.ndarray | torch.Tensor,
    x_new: np.ndarray | torch.Tensor,
    *,
    rank: str = "numerical",
    eps: float | None = None,
    energy: float = 0.99,
    method: str = "auto",
    spectrum_in: Spectrum | None = None,
    spectrum_out: Spectrum | None = None,
) -> RidTerms:
    """Return RID(X → X') with ΔS, ΔD, both support terms, both eRanks and the kept rank r of X.

    `rank`: 'numerical' (σ > max(S,H)·eps·σ_max; eps defaults to the input dtype's machine epsilon) or
    'energy' (fewest σ holding `energy` of Σσ²). Precomputed spectra of X / X' may be passed to reuse them.

    Examples:
        >>> x = np.random.default_rng(0).standard_normal((16, 4))
        >>> x_new = x.copy()
        >>> x_new[:, 3] = x[:, 0]
        >>> t = rid_terms(x, x_new)
        >>> round(t.erank_in, 3), round(t.erank_out, 3), t.rank  # ΔS = |2.935 − 3.864| / min(16, 4)
        (3.864, 2.935, 4)
        >>> round(t.dS, 3), round(t.dD_token, 3), round(t.dD_hidden, 3)
        (0.232, 0.0, 0.0)
    """
    if eps is None:
        eps = dtype_eps(x)
    spec = spectrum_in if spectrum_in is not None else spectrum(x, method=method)
    spec_out = spectrum_out if spectrum_out is not None else spectrum(x_new, method=method, vectors=False)
    s, h = spec.shape
    if spec_out.shape != (s, h):
        raise ValueError(f"X is {s} x {h} but X' is {spec_out.shape[0]} x {spec_out.shape[1]}")
    r = spec.rank(rank, eps, energy)
    if method == "auto" and spec.route == "gram" and r > 0:
        kappa = float(spec.sigma[0] / spec.sigma[r - 1])
        if _EPS64 * kappa * kappa > _GRAM_TOL:
            spec = _svd_spectrum(spec.tall, spec.transposed)
            r = spec.rank(rank, eps, energy)
    z_new = spec_out.tall
    big, small = _support_outside(spec, z_new, r)
    token2, hidden2 = (small, big) if spec.transposed else (big, small)
    norm = float(torch.linalg.vector_norm(z_new))
    if norm > 0:
        d_token, d_hidden = math.sqrt(token2) / (2 * norm), math.sqrt(hidden2) / (2 * norm)
    else:
        d_token = d_hidden = 0.0
    e_in, e_out = spec.erank(), spec_out.erank()
    d_s = abs(e_out - e_in) / min(s, h)
    d_d = d_token + d_hidden
    return RidTerms(d_s + d_d, d_s, d_d, d_token, d_hidden, e_in, e_out, r, spec.route)


def rid(
    x: np.ndarray | torch.Tensor,
    x_new: np.ndarray | torch.Tensor,
    *,
    rank: str = "numerical",
    eps: float | None = None,
    energy: float = 0.99,
    method: str = "auto",
) -> Rid:
    """Return (RID, ΔS, ΔD) of the update X → X' (docs/methods.md#erank-and-rid); see `rid_terms` for the options.

    Examples:
        >>> x = np.random.default_rng(0).standard_normal((16, 4))
        >>> [round(v, 3) for v in rid(x, x)]  # no update
        [0.0, 0.0, 0.0]
        >>> x_new = x.copy()
        >>> x_new[:, 3] = x[:, 0]  # one hidden direction collapses onto another: eRank falls, no new support
        >>> [round(v, 3) for v in rid(x, x_new)]
        [0.232, 0.232, 0.0]
    """
    t = rid_terms(x, x_new, rank=rank, eps=eps, energy=energy, method=method)
    return Rid(t.rid, t.dS, t.dD)
