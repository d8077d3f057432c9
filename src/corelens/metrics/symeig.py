"""Symmetric eigendecomposition with eigenvectors on demand, for any contiguous range of eigenvalues.

RID needs all eigenvalues of a Gram matrix but the eigenvectors of only part of its spectrum (the discarded
directions, or the kept ones), and a full `eigh` costs several times an `eigvalsh` on a CPU. On the CPU the
matrix is reduced once to tridiagonal form (LAPACK `dsytrd`); all eigenvalues come from the tridiagonal
(`dsterf`, O(n²)), and the eigenvectors of a requested range from MRRR on the tridiagonal (`dstemr`)
followed by the back-transformation with the Householder reflectors, applied in blocks (compact WY form)
through torch matrix products. Off the CPU (or for small matrices) one `torch.linalg.eigh` does it all.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg.lapack as lapack
import torch

from corelens.errors import OptionError

EIG_METHODS = ("auto", "tridiagonal", "eigh", "eigvalsh")
_SMALL = 256  # below this size a full eigh is cheap: 'auto' takes it
_WY_BLOCK = 128  # reflectors applied together in the back-transformation (fewer, larger products)


def _wy_apply(reflectors: np.ndarray, tau: np.ndarray, y: torch.Tensor) -> torch.Tensor:
    """Return Q·y with Q = H_0 H_1 ⋯ H_{n−2} from `dsytrd(lower)` (reflector j acts on rows j+1 …)."""
    n = y.shape[0]
    for j0 in reversed(range(0, n - 1, _WY_BLOCK)):
        j1 = min(j0 + _WY_BLOCK, n - 1)
        b = j1 - j0
        # Columns j0..j1-1 of V, rows j0+1.. (above that they are zero): unit entry at row j+1.
        v = np.tril(reflectors[j0 + 1 :, j0:j1], -1)
        v[np.arange(b), np.arange(b)] = 1.0
        t = tau[j0:j1]
        dead = t == 0  # LAPACK's identity reflectors
        v[:, dead] = 0.0
        vt = torch.from_numpy(np.ascontiguousarray(v))
        # H_j0 ⋯ H_j1-1 = I − V S⁻¹ Vᵀ with S = diag(1/τ) + strictly-upper(VᵀV).
        s = torch.triu(vt.T @ vt, 1)
        s.diagonal().copy_(torch.from_numpy(np.where(dead, 1.0, 1.0 / np.where(dead, 1.0, t))))
        rows = y[j0 + 1 :]
        coef = torch.linalg.solve_triangular(s, vt.T @ rows, upper=True)
        y[j0 + 1 :] = rows - vt @ coef
    return y


class SymEig:
    """Eigenvalues (ascending, float64) of a symmetric matrix, and eigenvectors of index ranges on demand."""

    def __init__(self, g: torch.Tensor, method: str = "auto") -> None:
        if method not in EIG_METHODS:
            raise OptionError(f"unknown eigen method {method!r}; expected one of {EIG_METHODS}")
        n = g.shape[0]
        if method == "auto":
            method = "tridiagonal" if g.device.type == "cpu" and n >= _SMALL else "eigh"
        self.n = n
        self.method = method
        self._g = g
        self._vectors: torch.Tensor | None = None
        self._cached: tuple[int, int, torch.Tensor] | None = None  # last range computed (it is often reused)
        if method == "tridiagonal":
            self._tridiagonalise()
        elif method == "eigh":
            self.values, self._vectors = torch.linalg.eigh(g)
        else:
            self.values = torch.linalg.eigvalsh(g)

    def _tridiagonalise(self) -> None:
        a = self._g.cpu().numpy()
        lwork, info = lapack.dsytrd_lwork(self.n, lower=1)
        # `a` is symmetric, so its C-ordered buffer read as Fortran is the same matrix: no copy on the way in.
        c, d, e, tau, info = lapack.dsytrd(a.T, lower=1, lwork=int(lwork))
        if info != 0:
            raise np.linalg.LinAlgError(f"dsytrd failed (info={info})")
        values, info = lapack.dsterf(d, e)
        if info != 0:
            raise np.linalg.LinAlgError(f"dsterf failed (info={info})")
        self._c, self._d, self._e, self._tau = c, d, e, tau
        self.values = torch.from_numpy(values).to(self._g.device)
        self.method = "tridiagonal"

    def vectors(self, lo: int, hi: int) -> torch.Tensor:
        """Return the eigenvectors of ascending eigenvalue indices [lo, hi) as columns (n x (hi − lo))."""
        if not 0 <= lo <= hi <= self.n:
            raise IndexError(f"eigenvector range [{lo}, {hi}) outside 0..{self.n}")
        if hi == lo:
            return torch.zeros(self.n, 0, dtype=torch.float64, device=self._g.device)
        if self._vectors is not None:
            return self._vectors[:, lo:hi]
        if self._cached is not None and self._cached[0] <= lo and hi <= self._cached[1]:
            first, _, block = self._cached
            return block[:, lo - first : hi - first]
        if self.method == "eigvalsh":
            self._tridiagonalise()
        e = np.zeros(self.n)
        e[:-1] = self._e
        m, _, z, info = lapack.dstemr(self._d, e, 3, 0.0, 0.0, lo + 1, hi, compute_v=1)
        if info != 0 or m != hi - lo:
            raise np.linalg.LinAlgError(f"dstemr failed (info={info}, found {m} of {hi - lo})")
        y = torch.from_numpy(np.ascontiguousarray(z[:, :m]))
        block = _wy_apply(self._c, self._tau, y).to(self._g.device)
        self._cached = (lo, hi, block)
        return block
