"""The streaming heads' band kernel (band.cpp), compiled on first use with torch's C++ extension loader.

One pass per tile of R query positions: GEMMs for the sink and window scores read the keys in place, each row's
softmax runs over exactly its own keys, and GEMMs for the values write the normalised rows into the output; only
R - 1 columns per row are computed and discarded (R = `band_rows`), and there is no merge. Where the
extension cannot be built (no compiler, no ninja, another platform) or `CORELENS_NATIVE=0` is set, `module()`
returns None and the split tiles (pure PyTorch) run instead; `error()` says why.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from functools import lru_cache
from pathlib import Path

import torch

from corelens.attention.kernels.masks import Pattern, tile_mask
from corelens.attention.kernels.tiling import Group, Scratch

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("band.cpp")
_STATE: dict[str, object] = {}


def _flags() -> tuple[str, list[str]]:
    """Return the build's name suffix and compiler flags for this CPU (AVX2 + FMA where torch reports them).

    -fopenmp: torch's CPU build runs `at::parallel_for` on OpenMP, and the header-inline loop is serial without it.
    """
    capability = torch.backends.cpu.get_cpu_capability()
    if capability in ("AVX2", "AVX512"):
        return "avx2", ["-O3", "-fopenmp", "-mavx2", "-mfma"]
    return "default", ["-O3", "-fopenmp"]


def module():
    """Return the compiled extension (built once per machine and source, then cached), or None."""
    if "module" in _STATE:
        return _STATE["module"]
    mod = None
    if os.environ.get("CORELENS_NATIVE", "1") == "0":
        _STATE["error"] = "disabled by CORELENS_NATIVE=0"
    else:
        try:
            from torch.utils.cpp_extension import load_inline

            venv_bin = Path(sys.executable).parent  # ninja from PyPI (requirements.lock) when none is on PATH
            if shutil.which("ninja") is None and (venv_bin / "ninja").exists():
                os.environ["PATH"] = f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"
            suffix, flags = _flags()
            # The source text (not its path) keys the cached build: every checkout of the same band.cpp
            # reuses one build instead of recompiling (about a minute) whenever another checkout built last.
            mod = load_inline(
                name=f"corelens_band_{suffix}",
                cpp_sources=[SOURCE.read_text()],
                extra_cflags=flags,
                extra_ldflags=["-fopenmp"],  # at::parallel_for is OpenMP, as in torch itself
                no_implicit_headers=True,  # band.cpp includes its own headers, after its CPU-capability define
                verbose=False,
            )
        except Exception as err:  # no compiler / ninja / headers: the pure-PyTorch tiles run instead
            _STATE["error"] = (
                f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:300] if str(err) else ''}"
            )
            log.warning(
                "corelens: the C++ band kernel is unavailable (%s); using the split tiles", _STATE["error"]
            )
    _STATE["module"] = mod
    return mod


def error() -> str | None:
    """Return why the extension is unavailable (after `module()` returned None), else None."""
    return _STATE.get("error")  # type: ignore[return-value]


def band_rows(groups: int) -> int:
    """Return the tile height R for `groups` stacked query heads: about 128 stacked rows, R in 16 .. 32."""
    return int(min(32, max(16, -(-128 // max(groups, 1)))))


def layout(pattern: Pattern, rows: int) -> torch.Tensor:
    """Return the (R, S + W + R - 1) tile rule band.cpp applies: every sink; row r keeps window columns r .. r + W - 1.

    C++ cannot call the rule, so `attend` checks this statement against it (`masks.tile_mask`) once per pattern.
    """
    span = torch.ones(rows, pattern.window + rows - 1, dtype=torch.bool).triu(0).tril(pattern.window - 1)
    return torch.cat([torch.ones(rows, pattern.sink, dtype=torch.bool), span], dim=1)


@lru_cache(maxsize=64)
def _checked(pattern: Pattern, rows: int) -> None:
    if not torch.equal(layout(pattern, rows), tile_mask(pattern, rows)):
        raise ValueError(f"band.cpp's tile rule differs from the mask rule for {pattern} (R = {rows})")


def attend(group: Group, block: int | None = None, scratch: Scratch | None = None) -> None:
    """Write the rows of `group` past its prefix (`Group.end` .. n - 1) with the C++ band kernel; fp32 copies
    of the query and output where they are not fp32 with a contiguous last dimension. `block`: R."""
    if module() is None:
        raise RuntimeError(f"the C++ band kernel is unavailable: {error()}")
    heads, p = group.heads, group.pattern
    rows = block or band_rows(len(heads))
    _checked(p, rows)
    g, end = len(heads), group.end
    q, q_heads = group.query, heads
    if q.dtype != torch.float32 or q.stride(-1) != 1:
        q, q_heads = q[heads].float().contiguous(), torch.arange(g)
    out, o_heads = group.out, heads
    direct = out.dtype == torch.float32 and out.stride(-1) == 1
    if not direct:
        out, o_heads = torch.empty(group.n, g, group.value.shape[-1], device=q.device), torch.arange(g)
    module().band(  # type: ignore[union-attr]
        q,
        q_heads,
        group.key,
        group.value,
        out,
        o_heads,
        group.start,
        end,
        p.sink,
        p.window,
        group.scale,
        rows,
    )
    if not direct:
        group.write(end, out[end:])
