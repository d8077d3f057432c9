"""Options every command that loads a model shares: where the checkpoint is, and where and how it runs."""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

from corelens.commands.argtypes import device, device_map, max_memory

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
        "--allow-other-model",
        action="store_true",
        help="use a head set found on another model (another architecture, rope or weights) with a warning "
        "recorded in the manifest, instead of refusing it",
    )
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
        "strict": not getattr(args, "allow_other_model", False),
    }


# Set to 1 to see the progress lines (torch imported, model loaded, in how many seconds) in a log file too.
PROGRESS_ENV = "CORELENS_PROGRESS"


def progress_lines() -> bool:
    """Return True when progress lines go to standard error: it is a terminal (or CORELENS_PROGRESS=1), so
    that a pipe or a test reading an error sees that one line only."""
    return sys.stderr.isatty() or os.environ.get(PROGRESS_ENV) == "1"


def main_process() -> bool:
    """Return True in the process that prints results: the only one, or rank 0 under torchrun."""
    from corelens.runs.dist import current

    return current().main


def limits_of(args: argparse.Namespace):
    """Return the `Limits` of parsed --max-pixels / --max-pages (the defaults for a command without them)."""
    from corelens.data.sample import Limits

    defaults = Limits()
    return Limits(
        max_pixels=getattr(args, "max_pixels", defaults.max_pixels),
        max_pages=getattr(args, "max_pages", defaults.max_pages),
    )


def _targets_needed(args: argparse.Namespace) -> str | None:
    """Return why this command needs target boxes in its samples (and what to use without them), or None."""
    if getattr(args, "omega", None) == "targets":  # rank: Ω is the cells under the targets
        return "--omega targets (the default) measures attention on them; use --omega causal to estimate Ω from the model instead"
    if getattr(args, "op", None) == "knockout" and getattr(args, "keys", None) == "omega":
        return "--op knockout --keys omega knocks out the keys under them; use --keys visual instead"
    if args.command == "sap" and "key" in ",".join(args.prior or ["key"]).split(","):
        # sap's default priors include `key`, the softmax of each cell's overlap with the targets.
        return "the key prior (one of the default priors) is built from them; pick others, e.g. --prior vis_attn,complexity,noise"
    return None


def check_data(args: argparse.Namespace) -> None:
    """Read --data before the model loads: stop, as one line naming the file, when no sample can be used (an
    empty file, every record bad) or when no sample has the target boxes the command needs."""
    from corelens.data.sample import read_samples
    from corelens.errors import InputError
    from corelens.runs.driver import Tally, skip_reason

    samples, skipped = read_samples(
        args.data,
        skip_bad=getattr(args, "skip_bad", False),
        limit=getattr(args, "limit", None),
        limits=limits_of(args),
    )
    if not samples:  # the same error the run would give, before minutes of loading a model
        Tally(0, Counter(skip_reason(bad.to_dict()) for bad in skipped)).require(args.data)
    needs = _targets_needed(args)
    if needs and not any(sample.targets for sample in samples):
        raise InputError(f"no sample has target boxes ('targets'): {needs}", file=args.data)
