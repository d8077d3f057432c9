"""Options every command that loads a model shares: where the checkpoint is, and where and how it runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corelens.errors import CorelensError, OptionError

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def add_model_options(
    p: argparse.ArgumentParser, *, required: bool = True, default: str | None = None
) -> None:
    """Add --model, --revision, --device, --dtype, --device-map, --max-memory and --offload-folder to `p`."""
    p.add_argument(
        "--model",
        required=required,
        default=default,
        help="checkpoint folder or hub id ORG/NAME[@REVISION] (read from the hub cache; HF_HUB_OFFLINE=1 "
        "never downloads)",
    )
    p.add_argument("--revision", default=None, help="hub branch, tag or commit (also ORG/NAME@REVISION)")
    p.add_argument(
        "--device",
        type=device,
        default="auto",
        help="auto (CUDA when available), cpu, cuda, cuda:N; torchrun: cuda:LOCAL_RANK",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPE_CHOICES,
        help="model weights; auto: the checkpoint's dtype on a GPU, float32 on the CPU (scores are always fp32)",
    )
    p.add_argument(
        "--device-map",
        type=device_map,
        default=None,
        help="spread a model over devices: auto, balanced, balanced_low_0, sequential or a JSON file",
    )
    p.add_argument(
        "--max-memory",
        type=max_memory,
        default=None,
        help="with --device-map: per device, e.g. 0=70GiB,1=70GiB,cpu=200GiB",
    )
    p.add_argument("--offload-folder", default=None, help="with a device map that offloads to disk")


def load_options(args: argparse.Namespace) -> dict:
    """Return the keyword arguments of `corelens.load` from parsed model options."""
    return {
        "revision": args.revision,
        "device": args.device,
        "dtype": args.dtype,
        "device_map": args.device_map,
        "max_memory": args.max_memory,
        "offload_folder": args.offload_folder,
    }


def main_process() -> bool:
    """Return True in the process that prints results: the only one, or rank 0 under torchrun."""
    from corelens.runs.dist import current

    return current().main


def add_resample_options(p: argparse.ArgumentParser, verb: str) -> None:
    """Add --stable-p and --rank-resamples (ranking uncertainty, docs/methods.md#ranking-uncertainty) to `p`."""
    from corelens.metrics.headsets import STABLE_P

    p.add_argument("--stable-p", type=float, default=STABLE_P, help="P(top-k) threshold of the stable set")
    p.add_argument(
        "--rank-resamples",
        type=int,
        default=0,
        help=f"also {verb} the top-k of R bootstrap resamples of the ranking (needs the run's ram.parquet)",
    )


def print_resampled(result, resamples: int) -> None:
    """Print the table of results over ranking resamples, where the run made one."""
    if result.resampled is not None:
        print(f"top-k over {resamples} resamples of the ranking (median, 90 % interval):")
        print(result.resampled.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


def checked(check: Callable[[str], Any], name: str | None = None) -> Callable[[str], Any]:
    """Return an argparse `type` that runs `check(text)`: its CorelensError becomes the parser's error line.

    So a malformed value stops the command while it parses, before any model loads, with the message of
    the check the command itself would run later (argparse turns ArgumentTypeError into `usage` + one line).
    """

    def convert(text: str) -> Any:
        try:
            return check(text)
        except CorelensError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    convert.__name__ = name or check.__name__
    return convert


def positive(text: str) -> int:
    """argparse `type`: a whole number of at least 1 (sizes, counts, repeats)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


# The types below check a value while the command line is parsed, so that a malformed one stops the command
# before any model loads; each returns the text as given (the experiment reads it as before).


def output_path(text: str) -> str:
    """argparse `type` of a file or folder to write: refused when an existing part of its path is a file."""
    for parent in Path(text).expanduser().parents:  # nearest first
        if parent.exists():
            if not parent.is_dir():
                raise argparse.ArgumentTypeError(f"cannot write {text}: {parent} is a file, not a folder")
            break
    return text


def output_file(text: str) -> Path:
    """`output_path` as a Path (the benchmarks' --json)."""
    return Path(output_path(text))


def existing_path(text: str) -> str:
    """argparse `type` of a file or folder to read: it must exist."""
    if not Path(text).expanduser().exists():
        raise argparse.ArgumentTypeError(f"{text} does not exist")
    return text


def samples_path(text: str) -> str:
    """argparse `type` of `--data`: a sample file that exists, or NAME:PATH of a dataset whose PATH exists."""
    from corelens.data.readers import parse_spec

    parsed = parse_spec(text)
    existing_path(str(parsed[1]) if parsed else text)
    return text


def _k_list(text: str) -> str:
    from corelens.metrics.headsets import parse_k

    parse_k(text)
    return text


def _k_one(text: str) -> str:
    from corelens.metrics.headsets import k_value

    k_value(text)
    return text


def _token_size(text: str) -> str:
    """A token count (128) or a share of the median prompt (25%), as corelens.experiments.hybrid.resolve_size reads it."""
    spec = text.strip()
    try:
        value = float(spec[:-1]) if spec.endswith("%") else int(spec)
    except ValueError:
        raise OptionError(f"bad size {text!r}: expected a token count (1024) or a share (25%)") from None
    if value < 0:
        raise OptionError(f"bad size {text!r}: must not be negative")
    return text


def _device(text: str) -> str:
    import torch

    if text != "auto":
        try:
            torch.device(text)
        except (RuntimeError, ValueError):
            raise OptionError(f"unknown device {text!r}: expected auto, cpu, cuda or cuda:N") from None
    return text


def _device_map(text: str) -> str:
    from corelens.models.loaded import DEVICE_MAPS

    if text not in DEVICE_MAPS and not Path(text).is_file():
        raise OptionError(f"{text}: expected {', '.join(DEVICE_MAPS)} or a JSON file")
    return text


def _max_memory(text: str) -> str:
    from corelens.models.loaded import parse_max_memory

    parse_max_memory(text)
    return text


def names_of(allowed: tuple[str, ...], what: str) -> Callable[[str], str]:
    """Return an argparse `type` of a comma list whose items are all in `allowed`."""

    def check(text: str) -> str:
        items = [t.strip() for t in text.split(",") if t.strip()]
        unknown = [t for t in items if t not in allowed]
        if unknown or not items:
            raise OptionError(f"unknown {what} {unknown or text!r}; expected some of {', '.join(allowed)}")
        return text

    return checked(check, what.replace(" ", "_"))


k_list = checked(_k_list, "k_list")
k_one = checked(_k_one, "k")
token_size = checked(_token_size, "size")
device = checked(_device, "device")
device_map = checked(_device_map, "device_map")
max_memory = checked(_max_memory, "max_memory")
