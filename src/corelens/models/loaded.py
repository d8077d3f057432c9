"""`load()`: a checkpoint (folder or hub id) and its processor, with the text decoder on the corelens attention.

Device, precision and placement follow what the user asks and what the machine has:

- `device="auto"`: CUDA when available, else the CPU; under torchrun, `cuda` means `cuda:LOCAL_RANK`.
- `dtype="auto"`: the checkpoint's own dtype on a GPU (bf16 for most released VLMs), float32 on the CPU. Every
  probe, intervention, prior and kernel computes its scores and softmax rows in fp32 whatever the model's
  dtype, and hands its output back in the model's dtype.
- `device_map`: "auto", "balanced", "balanced_low_0", "sequential", a JSON file or a dict, passed to
  transformers' `from_pretrained` (accelerate dispatch) for models larger than one GPU; under torchrun each
  rank maps onto its own `device_count // LOCAL_WORLD_SIZE` GPUs.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

from corelens.attention import NAME, register
from corelens.attention.modules import decoder_attention_modules
from corelens.errors import CorelensError, UnsupportedModelError
from corelens.models.families import FAMILIES, Family, family_of
from corelens.models.hub import resolve
from corelens.runs import identity

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")

SUPPORTED = FAMILIES  # model_type -> Family (corelens.models.families)

log = logging.getLogger(__name__)


def text_attention(model) -> str | None:
    """Return the attention implementation the text decoder of `model` runs on (None if it has no config)."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "_attn_implementation", None)


def adopt(model: torch.nn.Module) -> None:
    """Put a user-loaded model's text decoder on the corelens attention, saying so once, or refuse in one line.

    Probes and interventions are hooks inside the corelens attention function: on "sdpa", "eager" or a kernel
    they would never run, and an ablation would silently change nothing.
    """
    before = text_attention(model)
    if before == NAME:  # corelens.load() put it there already
        return
    register()
    try:
        # text decoder only: the vision tower keeps its own implementation, as load() does
        model.set_attn_implementation({"text_config": NAME})
    except Exception as err:  # noqa: BLE001 - any refusal by the model class becomes the one-line error below
        raise UnsupportedModelError(
            f"{type(model).__name__}: its text attention is {before!r} and could not be switched to "
            f"corelens' {NAME!r} ({type(err).__name__}: {err}); load it with corelens.load() or "
            f"attn_implementation={{'text_config': {NAME!r}}}"
        ) from None
    after = text_attention(model)
    if after != NAME:  # transformers only warns for a class that cannot switch dynamically
        raise UnsupportedModelError(
            f"{type(model).__name__}: its text attention is {before!r} and stayed {after!r}; corelens needs "
            f"{NAME!r}: load it with corelens.load() or attn_implementation={{'text_config': {NAME!r}}}"
        )
    log.warning(
        "corelens: note: %s text attention switched from %r to %r", type(model).__name__, before, NAME
    )


@dataclass
class Loaded:
    """A loaded model: the transformers model and processor plus what corelens needs to address heads."""

    model: torch.nn.Module
    processor: object
    path: Path
    model_type: str
    attention_layers: list[torch.nn.Module]  # decoder self-attention modules, in layer order
    source: dict = field(default_factory=dict)  # id, revision and commit of a hub checkpoint
    # False (--allow-other-model): a head set found on another model is used with a warning, not refused.
    strict_identity: bool = True
    # What a head set's model differs in (HeadSet.check): warned, and recorded in the run's manifest.
    identity_notes: list = field(default_factory=list)

    def __post_init__(self) -> None:
        # A path as from_pretrained takes it (a str) is a Path from here on.
        self.path = Path(self.path) if isinstance(self.path, str) else self.path
        # A model the user loaded (any attention) is switched to corelens' attention here; a processor-only
        # Loaded (no weights, no attention layers) has nothing to switch.
        if isinstance(self.model, torch.nn.Module) and self.attention_layers:
            adopt(self.model)

    @classmethod
    def from_model(
        cls,
        model: torch.nn.Module,
        processor: object = None,
        path: str | Path | None = None,
        *,
        with_processor: bool = True,
    ) -> Loaded:
        """Return a user-loaded transformers model (and its processor) as a `Loaded`, its text attention
        switched to corelens' (with a note) or refused in one line. `path`: its checkpoint folder (`str` or
        `Path`), by default the folder it was loaded from when that is one; it names the model's identity,
        and its processor is read from it when none is given (unless `with_processor` is False).

        Examples:
            >>> import corelens as cl
            >>> from transformers import AutoModelForImageTextToText
            >>> from corelens.organism import organism_path
            >>> model = AutoModelForImageTextToText.from_pretrained(organism_path(), attn_implementation="sdpa")
            >>> m = cl.Loaded.from_model(model, path=str(organism_path()))
            >>> m.num_layers, m.num_heads, type(m.path).__name__
            (4, 8, 'PosixPath')
        """
        if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
            raise UnsupportedModelError(
                f"{type(model).__name__} is not a transformers model: give corelens a model from "
                "from_pretrained (or load one with corelens.load)"
            )
        if path is None:
            named = getattr(model.config, "_name_or_path", None) or getattr(model, "name_or_path", None)
            path = Path(named) if named and Path(named, "config.json").is_file() else None
        model_type = getattr(model.config, "model_type", None)
        try:
            layers = decoder_attention_modules(model)
        except Exception as err:  # noqa: BLE001 - a model without decoder layers corelens can find
            raise UnsupportedModelError(
                f"{type(model).__name__} ({model_type}): corelens finds no decoder attention layers in it ({err})"
            ) from None
        if processor is None and path is not None and with_processor:
            processor = read_processor(Path(path))  # the checkpoint's own, as corelens.load reads it
        return cls(model, processor, path, model_type, layers)

    @property
    def family(self) -> Family:
        """Return the model's registered family (its layout, processor quirks, vision tower)."""
        return family_of(self.model_type)

    @property
    def text_config(self):
        """Return the text decoder's config."""
        return self.model.config.get_text_config()

    @property
    def num_layers(self) -> int:
        """Return the number of decoder layers."""
        return len(self.attention_layers)

    @property
    def num_heads(self) -> int:
        """Return the number of query heads per decoder layer."""
        return self.text_config.num_attention_heads

    @property
    def num_kv_heads(self) -> int:
        """Return the number of key/value heads per decoder layer."""
        return self.text_config.num_key_value_heads or self.num_heads

    @property
    def device(self) -> torch.device:
        """Return the device inputs go to: the parameters', or the first accelerator of a device map."""
        placed = getattr(self.model, "hf_device_map", None)
        if placed:
            # Offloaded ("cpu" / "disk") modules execute on the main device; the inputs start on the CPU
            # when everything is on the CPU, else on the first accelerator of the map.
            accelerators = [d for d in placed.values() if str(d) not in ("cpu", "disk", "meta")]
            if not accelerators:
                return torch.device("cpu")
            first = accelerators[0]
            return torch.device(f"cuda:{first}" if isinstance(first, int) else first)
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """Return the dtype of the model's weights."""
        return self.model.dtype

    def layer_modules(self) -> list[tuple[int, torch.nn.Module]]:
        """Return (layer index, attention module) pairs, for hook activation."""
        return list(enumerate(self.attention_layers))

    def identity(self) -> dict:
        """Return the model's identity, never its path (`corelens.runs.identity`): its hub id and commit, a
        digest of its config and of its weights' metadata, and the summary a refusal names differences from.

        The weights' metadata come from the checkpoint folder's files (safetensors headers); a model given as
        an object with no folder beside it is described by its state dict. Computed once per `Loaded`.
        """
        cached = self.__dict__.get("_identity")
        if cached is None:
            folder = Path(self.path) if self.path is not None else None
            if folder is not None and (folder / "config.json").is_file():
                weights, kind = identity.weights_of_folder(folder), "folder"
            else:
                weights, kind = identity.weights_of_state(self.model.state_dict()), "object"
            cached = identity.record(self.model.config, weights, self.source, kind)
            self.__dict__["_identity"] = cached
        return cached

    def config_hash(self) -> str:
        """Return the digest of the model's identity (config content and weights' metadata; no path)."""
        return self.identity()["digest"]


def as_loaded(m: Any, what: str = "this call", *, with_processor: bool = True) -> Loaded:
    """Return `m` as a `Loaded`: itself, or a bare transformers model wrapped (`Loaded.from_model`); anything
    else is one line saying what `what` takes."""
    if isinstance(m, Loaded):
        return m
    if isinstance(m, torch.nn.Module) and hasattr(m, "config"):
        return Loaded.from_model(m, with_processor=with_processor)
    raise UnsupportedModelError(
        f"{what} takes a corelens.Loaded (corelens.load, corelens.Loaded.from_model) or a transformers model, "
        f"got {type(m).__name__}"
    )


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """Return the torch device for `--device auto|cpu|cuda|cuda:N` (under torchrun, cuda = cuda:LOCAL_RANK).

    Examples:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    text = str(spec).strip().lower()
    local_rank = int(os.environ.get("LOCAL_RANK") or 0)
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
    if text == "cuda":
        text = f"cuda:{local_rank}"
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise CorelensError(f"--device {spec!r}: expected auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise CorelensError(f"--device {spec}: no CUDA device is available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise CorelensError(
                f"--device {spec}: this machine has {torch.cuda.device_count()} CUDA device(s)"
                + (f" (LOCAL_RANK={local_rank})" if str(spec).strip().lower() in ("auto", "cuda") else "")
            )
    return device


def resolve_dtype(spec: str | torch.dtype, config, device: torch.device) -> torch.dtype:
    """Return the model dtype for `--dtype auto|float32|bfloat16|float16` (auto: the checkpoint's on a GPU).

    Examples:
        >>> resolve_dtype("bf16", None, torch.device("cpu"))
        torch.bfloat16
    """
    if isinstance(spec, torch.dtype):
        return spec
    text = str(spec).strip().lower().removeprefix("torch.")
    if text == "auto":
        if device.type == "cpu":
            return torch.float32
        stored = getattr(config, "dtype", None) or getattr(config.get_text_config(), "dtype", None)
        if isinstance(stored, str):
            stored = DTYPES.get(stored.removeprefix("torch."))
        return stored if isinstance(stored, torch.dtype) else torch.float32
    if text not in DTYPES:
        raise CorelensError(f"--dtype {spec!r}: expected auto, float32, bfloat16 or float16")
    return DTYPES[text]


def parse_max_memory(spec: str | dict | None) -> dict | None:
    """Return accelerate's `max_memory` from "0=70GiB,1=70GiB,cpu=200GiB" (or a dict as it is).

    Examples:
        >>> parse_max_memory("0=70GiB,cpu=200GiB")
        {0: '70GiB', 'cpu': '200GiB'}
    """
    if spec is None or isinstance(spec, dict):
        return spec
    out: dict = {}
    for part in filter(None, (p.strip() for p in str(spec).split(","))):
        name, sep, amount = part.partition("=")
        if not sep or not amount.strip():
            raise CorelensError(
                f"--max-memory {spec!r}: expected DEVICE=AMOUNT pairs, e.g. 0=70GiB,cpu=200GiB"
            )
        name = name.strip()
        out[int(name) if name.isdigit() else name] = amount.strip()
    return out


def rank_gpus(local_rank: int, local_world: int, count: int) -> list[int]:
    """Return the GPUs one rank's device map may use: its `count // local_world` consecutive devices.

    Examples:
        >>> rank_gpus(1, 2, 8)
        [4, 5, 6, 7]
    """
    per = count // max(local_world, 1)
    if per < 1:
        raise CorelensError(
            f"--device-map with {local_world} ranks on this node needs at least one GPU per rank ({count} found)"
        )
    return list(range(local_rank * per, (local_rank + 1) * per))


def resolve_device_map(spec: str | dict | Path | None, max_memory: dict | None) -> tuple[object, dict | None]:
    """Return (device_map, max_memory) for `from_pretrained`; under torchrun, limited to this rank's GPUs."""
    if spec is None or isinstance(spec, dict):
        device_map = spec
    elif str(spec) in DEVICE_MAPS:
        device_map = str(spec)
    else:
        path = Path(spec)
        if not path.is_file():
            raise CorelensError(f"--device-map {spec}: expected {', '.join(DEVICE_MAPS)} or a JSON file")
        try:
            device_map = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise CorelensError(f"{path}: not valid JSON ({err.msg}, line {err.lineno})") from None
        if not isinstance(device_map, dict):
            raise CorelensError(f"{path}: a device map is a JSON object of module name -> device")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
    if (
        device_map is not None
        and local_world > 1
        and isinstance(device_map, str)
        and torch.cuda.is_available()
    ):
        mine = rank_gpus(int(os.environ.get("LOCAL_RANK") or 0), local_world, torch.cuda.device_count())
        budget = max_memory or {}
        max_memory = {g: budget.get(g, torch.cuda.get_device_properties(g).total_memory) for g in mine}
        max_memory.update({k: v for k, v in budget.items() if not isinstance(k, int)})
    return device_map, max_memory


@contextmanager
def no_checkpoint_code(path: str | Path) -> Iterator[None]:
    """Turn transformers' refusal of a checkpoint into one line; corelens never runs a checkpoint's own code.

    Every `from_pretrained` here passes `trust_remote_code=False`: a config, processor or tokenizer whose
    `auto_map` points at Python files in the checkpoint is refused by transformers before anything is imported.
    """
    try:
        yield
    except ValueError as err:
        text = str(err)
        if "trust_remote_code" in text or "custom code" in text:
            raise UnsupportedModelError(
                f"{path}: the checkpoint asks to run its own code (auto_map, trust_remote_code); "
                "corelens does not run checkpoint code"
            ) from None
        if "does not recognize this architecture" in text:
            raise UnsupportedModelError(
                f"{path}: transformers does not know its model_type; supported: {sorted(FAMILIES)}"
            ) from None
        raise


def read_config(path: str | Path):
    """Return a checkpoint folder's transformers config (no checkpoint code run; one-line errors)."""
    with no_checkpoint_code(path):
        return AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)


def read_processor(path: str | Path):
    """Return a checkpoint folder's processor (no checkpoint code run; one-line errors)."""
    with no_checkpoint_code(path):
        return AutoProcessor.from_pretrained(path, local_files_only=True, trust_remote_code=False)


def load(
    path: str | Path,
    *,
    revision: str | None = None,
    dtype: torch.dtype | str = "auto",
    device: str | torch.device = "auto",
    device_map: str | dict | Path | None = None,
    max_memory: str | dict | None = None,
    offload_folder: str | Path | None = None,
    strict: bool = True,
) -> Loaded:
    """Load a VLM checkpoint (folder or hub id) + processor; its text decoder runs on the corelens attention.

    `strict=False` (`--allow-other-model`): a head set found on another model is used with a warning recorded
    in the run's manifest instead of being refused (`HeadSet.check`).

    Examples:
        >>> import corelens as cl
        >>> from corelens.organism import organism_path
        >>> m = cl.load(organism_path(), device="cpu")
        >>> m.model_type, m.num_layers, m.num_heads, m.dtype
        ('qwen2_5_vl', 4, 8, torch.float32)
    """
    started = time.perf_counter()
    found = resolve(path, revision)
    path = found.path
    config = read_config(path)
    if config.model_type not in FAMILIES:
        raise UnsupportedModelError(
            f"{path}: model_type {config.model_type!r} is not supported; supported: {sorted(FAMILIES)}"
        )
    target = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, config, target)
    device_map, max_memory = resolve_device_map(device_map, parse_max_memory(max_memory))
    placement = {}
    if device_map is not None:
        placement = {"device_map": device_map, "max_memory": max_memory}
        if isinstance(device_map, dict) and "disk" in map(str, device_map.values()):
            placement["offload_folder"] = str(offload_folder or tempfile.mkdtemp(prefix="corelens-offload-"))
    register()
    with no_checkpoint_code(path):
        model = AutoModelForImageTextToText.from_pretrained(
            path,
            local_files_only=True,
            trust_remote_code=False,
            dtype=torch_dtype,
            attn_implementation={"": "sdpa", "text_config": NAME, "vision_config": "sdpa"},
            **placement,
        )
    if device_map is None:
        model.to(target)
    model.eval()
    processor = read_processor(path)
    loaded = Loaded(
        model,
        processor,
        path,
        config.model_type,
        decoder_attention_modules(model),
        source=found.to_dict(),
        strict_identity=strict,
    )
    # Shown by the command line (its handler prints corelens' info lines); silent from Python by default.
    log.info("corelens: loaded %s (%s, %d layers x %d heads, %s on %s) in %.1f s", found.id or path.name, config.model_type,
             loaded.num_layers, loaded.num_heads, str(torch_dtype).removeprefix("torch."), loaded.device,
             time.perf_counter() - started)  # fmt: skip
    return loaded


def processor_only(path: str | Path) -> Loaded:
    """A `Loaded` with the checkpoint's processor and config but no weights: enough to lay out prompts."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise CorelensError(f"{path}: not a checkpoint folder (no config.json)")
    config = read_config(path)
    if config.model_type not in FAMILIES:
        raise CorelensError(f"{path}: model_type {config.model_type!r} is not supported")
    processor = read_processor(path)
    # prepare() reads the model's config only (tile sizes); the weights are never needed to count tokens.
    return Loaded(SimpleNamespace(config=config), processor, path, config.model_type, [])
