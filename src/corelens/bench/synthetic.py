"""What the benchmarks share: the random-weight decoder they time, its prompts, and the machine they ran on.

The decoder is a `Qwen2_5_VLTextModel` of realistic width (default 4 layers, hidden 2048, 16 query heads over
2 key/value heads, head_dim 128, intermediate 5632, vocabulary 1024), deterministic in its seed.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Decoder:
    """The shape of a benchmark's random-weight decoder (the options of the same names)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int

    def dims(self) -> dict[str, int]:
        """Return the shape as keyword arguments (of `build_model`) and as the result's keys."""
        return asdict(self)


def cores() -> int:
    """Return the number of CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def sync(device: str | torch.device) -> None:
    """Wait for queued GPU work, so that a wall-clock reading covers it (no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def mrope_section(head_dim: int) -> list[int]:
    """Return a Qwen2.5-VL mrope section (temporal, height, width) summing to head_dim / 2."""
    half = head_dim // 2
    side = 3 * half // 8
    return [half - 2 * side, side, side]


def build_model(
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab_size: int = 1024,
    seed: int = 0,
    attn_implementation: str = "sdpa",
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
) -> torch.nn.Module:
    """Build a random-weight `Qwen2_5_VLTextModel` (deterministic in `seed`) on `device` in `dtype`, eval mode."""
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLTextConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLTextModel

    import corelens.attention  # noqa: F401 - registers the "corelens" attention function

    head_dim = hidden // heads
    config = Qwen2_5_VLTextConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=1 << 17,
        use_cache=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": mrope_section(head_dim)},
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    model = Qwen2_5_VLTextModel(config).to(device=torch.device(device), dtype=dtype).eval()
    model.requires_grad_(False)
    return model


def make_input_ids(tokens: int, vocab_size: int = 1024, seed: int = 0) -> torch.Tensor:
    """Return a random (1, tokens) prompt, deterministic in `seed`."""
    generator = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, vocab_size, (1, tokens), generator=generator)


def machine_info() -> dict[str, Any]:
    """Return a description of the machine: platform, CPU model, core count and total memory."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cores_available": cores(),
    }
    if hasattr(os, "getloadavg"):
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]  # other work on the machine skews times
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            info["mem_total_gb"] = round(int(f.readline().split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    return info
