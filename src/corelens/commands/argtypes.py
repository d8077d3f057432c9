"""argparse `type`s of corelens' options: each checks a value while the command line is parsed.

So a malformed value stops the command at once, before any model loads, as argparse's usage and one line
`corelens CMD: error: argument --OPTION: why`; most return the text as given, which the experiment reads as
before. The checks are those the experiments run (head counts, layer sets, device maps...), so a value is
refused with the same words whether it comes from the command line or from Python.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corelens.choices import HEADS_FILLED
from corelens.errors import CorelensError, OptionError


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


def count(text: str) -> int:
    """argparse `type` of a count of draws, resamples or seeds: a whole number from 1 to `MAX_COUNT`.

    Examples:
        >>> count("200")
        200
    """
    from corelens.choices import MAX_COUNT

    value = positive(text)
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"at most {MAX_COUNT} (more draws buy no precision), got {value}")
    return value


def count_or_zero(text: str) -> int:
    """argparse `type` of an optional count (0: none), at most `MAX_COUNT` (see `count`)."""
    try:
        return 0 if text.strip() == "0" else count(text)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"0 (none) or a count: {err}") from None


def port(text: str) -> int:
    """argparse `type` of a TCP port: 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0 (any free port) to 65535, got {value}")
    return value


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
    if text != "auto":  # the default: checked without importing torch (argparse converts it at every parse)
        import torch

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


def policy_of(allowed: tuple[str, ...], what: str) -> Callable[[str], str]:
    """Return an argparse `type` of --policy: a registered name, a JSON object (`{"name": ..., field: value}`,
    the policy's `to_dict` without its heads) or a .json file holding one; it returns the object as sorted
    JSON text. Only the name is checked here (from `corelens.registered`, no import); the fields are checked
    against the policy's class before the model loads (`corelens.policies.Policy.from_dict`)."""
    import json

    def check(text: str) -> str:
        from corelens.data import jsonfile

        spec: Any = text.strip()
        if spec.endswith(".json") and Path(spec).is_file():
            spec = jsonfile.load(spec)
        elif spec.startswith("{"):
            spec = jsonfile.loads(spec, "--policy")
        else:
            spec = {"name": spec}
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise OptionError('a policy is a name or a JSON object with a "name", e.g. {"name": "zero"}')
        if spec["name"] not in allowed:
            raise OptionError(f"unknown {what} {spec['name']!r}; expected one of {', '.join(allowed)}")
        given = [f for f in HEADS_FILLED if f in spec]  # refused rather than silently overwritten
        if given:
            raise OptionError(f"field(s) {given} are filled from each head set; leave them out")
        return json.dumps(spec, sort_keys=True)

    return checked(check, "policy")


k_list = checked(_k_list, "k_list")
k_one = checked(_k_one, "k")
token_size = checked(_token_size, "size")
device = checked(_device, "device")
device_map = checked(_device_map, "device_map")
max_memory = checked(_max_memory, "max_memory")


def _syntax(what: str) -> Callable[[str], str]:
    """Return an argparse `type` checking a layer or head set's syntax; its range waits for the model's sizes."""

    def check(text: str) -> str:
        # Imported here (it imports torch): only a given --layers / --heads is checked, never --help.
        from corelens.attention import priors

        getattr(priors, f"parse_{what}s")(text, 1 << 20)  # any size: only the syntax can be wrong yet
        return text

    return checked(check, f"{what}_set")


layer_set, head_set = _syntax("layer"), _syntax("head")  # sap's --layers and --heads
