"""Token mixing (docs/methods.md#geometry): TME, the mean entropy of cosine-similarity rows, and MixIG = TME(X') − TME(X).

With unit rows n_t, W_tj = (cos(x_t, x_j) + 1) / 2 and P_tj = W_tj / Σ_k W_tk, the entropy of row t is
log Z_t − (Σ_j W_tj log W_tj) / Z_t with Z_t = Σ_j W_tj. Both sums are row sums of an S x S matrix that is
never held: it is built in row blocks, and by symmetry only the blocks on or above the diagonal are formed
(each off-diagonal block feeds its rows and, transposed, its columns). Float64 throughout: MixIG is a small
difference of two numbers near 1.

Conventions: a zero row has cosine 0 with every row, itself included (W = 1/2); cosines are clipped to
[−1, 1] before W is formed.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from corelens.errors import OptionError
from corelens.metrics.spectra import as_float64

TME_ROWS = ("mean", "last")
MIXIG_OF = ("output", "delta")

_NUMPY_ON_CPU = (
    True  # OpenBLAS' symmetric products beat torch's on the CPUs measured; False: torch everywhere
)
_BLOCK_ELEMENTS = 1 << 22  # entries of one S-wide block of W (32 MiB in float64): rows per block = this / S


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """Return the rows of `x` scaled to unit norm (zero rows stay zero)."""
    norms = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    return x / torch.where(norms > 0, norms, torch.ones_like(norms))


def _weights(cos: torch.Tensor, alpha: float) -> torch.Tensor:
    w = (cos.clamp_(-1.0, 1.0) + 1.0) * 0.5
    return w if alpha == 1.0 else w.pow_(alpha)


def _block_sums_numpy(n: np.ndarray, step: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Row sums of W and of W log W from upper-triangle row blocks, in place (OpenBLAS; syrk on the diagonal)."""
    s = n.shape[0]
    z, e = np.zeros(s), np.zeros(s)
    for i0 in range(0, s, step):
        rows = n[i0 : i0 + step]
        for j0 in range(i0, s, step):
            w = rows @ rows.T if j0 == i0 else rows @ n[j0 : j0 + step].T
            np.clip(w, -1.0, 1.0, out=w)
            w += 1.0
            w *= 0.5
            if alpha != 1.0:
                np.power(w, alpha, out=w)
            wlogw = np.log(w, out=np.zeros_like(w), where=w > 0)
            wlogw *= w
            z[i0 : i0 + step] += w.sum(1)
            e[i0 : i0 + step] += wlogw.sum(1)
            if j0 != i0:
                z[j0 : j0 + step] += w.sum(0)
                e[j0 : j0 + step] += wlogw.sum(0)
    return z, e


def row_entropies(
    x: np.ndarray | torch.Tensor, *, alpha: float = 1.0, block: int | None = None
) -> torch.Tensor:
    """Return the entropy −Σ_j P_tj log P_tj of every row t (nats, float64), P ∝ W^alpha.

    Examples:
        >>> row_entropies(np.eye(3)).numpy().round(4)  # W = (1, 1/2, 1/2) in every row
        array([1.0397, 1.0397, 1.0397])
    """
    n = unit_rows(as_float64(x))
    s = n.shape[0]
    step = block or max(1, min(s, _BLOCK_ELEMENTS // max(s, 1)))
    if n.device.type == "cpu" and _NUMPY_ON_CPU:
        z_np, e_np = _block_sums_numpy(n.numpy(), step, alpha)
        z, e = torch.from_numpy(z_np), torch.from_numpy(e_np)
        return torch.log(z) - e / z
    z = torch.zeros(s, dtype=n.dtype, device=n.device)
    e = torch.zeros_like(z)
    for i0 in range(0, s, step):
        rows = n[i0 : i0 + step]
        for j0 in range(i0, s, step):
            w = _weights(rows @ n[j0 : j0 + step].T, alpha)
            wlogw = torch.special.xlogy(w, w)
            z[i0 : i0 + step] += w.sum(1)
            e[i0 : i0 + step] += wlogw.sum(1)
            if j0 != i0:
                z[j0 : j0 + step] += w.sum(0)
                e[j0 : j0 + step] += wlogw.sum(0)
    return torch.log(z) - e / z


def tme(
    x: np.ndarray | torch.Tensor, *, rows: str = "mean", alpha: float = 1.0, block: int | None = None
) -> float:
    """Return the token mixing entropy of a state (S x H) in [0, 1]: mean ('mean') or last ('last') row.

    `alpha` sharpens the rows (P ∝ W^alpha; the authors' code uses 8, `corelens flow` 16).

    Examples:
        >>> x = np.random.default_rng(0).standard_normal((16, 4))
        >>> round(tme(np.ones((8, 4))), 3), round(tme(np.eye(8)), 3), round(tme(x), 3)
        (1.0, 0.983, 0.938)
        >>> round(tme(x, alpha=16), 3)  # sharper rows, lower entropy
        0.322
    """
    if rows not in TME_ROWS:
        raise OptionError(f"unknown TME rows {rows!r}; expected one of {TME_ROWS}")
    m = as_float64(x)
    s = m.shape[0]
    if s < 2:
        raise ValueError("TME needs at least two tokens")
    if rows == "last":
        n = unit_rows(m)
        w = _weights(n[-1:] @ n.T, alpha)
        z = w.sum()
        ent = torch.log(z) - torch.special.xlogy(w, w).sum() / z
        return float(ent) / math.log(s)
    return float(row_entropies(m, alpha=alpha, block=block).mean()) / math.log(s)


def mixig(
    x: np.ndarray | torch.Tensor,
    x_new: np.ndarray | torch.Tensor,
    *,
    rows: str = "mean",
    alpha: float = 1.0,
    of: str = "output",
) -> float:
    """Return MixIG = TME(X') − TME(X); `of='delta'` takes TME of the update ΔX = X' − X instead of X'.

    Examples:
        >>> x = np.random.default_rng(0).standard_normal((16, 4))
        >>> mixig(x, x)
        0.0
        >>> round(mixig(x, 0.5 * x + x.mean(0)), 3)  # tokens pulled toward their mean mix more
        0.03
    """
    if of not in MIXIG_OF:
        raise OptionError(f"unknown MixIG target {of!r}; expected one of {MIXIG_OF}")
    new = as_float64(x_new)
    if of == "delta":
        new = new - as_float64(x).to(new.device)
    return tme(new, rows=rows, alpha=alpha) - tme(x, rows=rows, alpha=alpha)
