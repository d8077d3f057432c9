"""What a command checks about its model before torch and the model load (seconds, not minutes).

`--model` must be a checkpoint folder (config.json beside the weights) of a supported family, or a hub id
that is in the hub cache or can be downloaded; each mistake is one line saying what to do: a folder of
samples given as the model, a GPT-2 (text-only) checkpoint, an id not in the cache with the exact command
that downloads it. Only `huggingface_hub` is imported (to resolve an id); the supported model types are the
family packages' names, read from the source tree (tests/test_preflight.py checks they are the registry's).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from corelens.errors import OptionError, UnsupportedModelError

FAMILIES = Path(__file__).resolve().parents[1] / "models" / "families"
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?")  # ORG/NAME[@REVISION], as --model takes it


def supported_types() -> list[str]:
    """Return the model types corelens supports: one family package each (corelens.models.families).

    Examples:
        >>> "qwen2_5_vl" in supported_types() and "gpt2" not in supported_types()
        True
    """
    return sorted(p.name for p in FAMILIES.iterdir() if (p / "__init__.py").is_file())


def checkpoint_folder(spec: str, revision: str | None = None) -> Path:
    """Return the folder of `--model spec` (a folder, or a hub id resolved through the cache), or refuse it."""
    path = Path(spec).expanduser()
    if path.is_file():
        raise OptionError(f"--model {spec}: a file, not a checkpoint folder; give the folder that holds its "
                          "config.json and weights")  # fmt: skip
    if path.is_dir():
        if not (path / "config.json").is_file():
            samples = sorted(path.glob("*.jsonl"))
            hint = f"; it holds sample files ({samples[0].name}): give those with --data" if samples else ""
            raise OptionError(f"--model {spec}: not a checkpoint folder (no config.json); give the folder that "
                              f"holds config.json and the weights{hint}")  # fmt: skip
        return path
    from corelens.models.hub import resolve

    return resolve(spec, revision).path


def head_count(config: dict) -> tuple[int, int] | None:
    """Return (decoder layers, query heads per layer) from a config.json's text config, None if it has none.

    Examples:
        >>> head_count({"text_config": {"num_hidden_layers": 4, "num_attention_heads": 8}})
        (4, 8)
    """
    text = config.get("text_config") or config.get("llm_config") or config
    layers, heads = text.get("num_hidden_layers"), text.get("num_attention_heads")
    return (int(layers), int(heads)) if isinstance(layers, int) and isinstance(heads, int) else None


def check_sizes(args: argparse.Namespace, config: dict) -> None:
    """Refuse a head count (--n-heads of ablate / hybrid) above the model's heads, read from its config.json."""
    sizes = getattr(args, "keep" if args.command == "hybrid" else "k", None)
    shape = head_count(config)
    if args.command not in ("ablate", "hybrid") or not isinstance(sizes, str) or shape is None:
        return
    total = shape[0] * shape[1]
    for size in sizes.split(","):
        if size.strip().isdigit() and int(size) > total:
            raise OptionError(
                f"--n-heads {size.strip()}: the model has {total} heads ({shape[0]} layers x {shape[1]}); "
                f"give at most {total}, or a share such as 10%"
            )


def check_model(args: argparse.Namespace) -> None:
    """Refuse, before the model loads, a `--model` that is no checkpoint of a supported family, or head
    counts it does not have."""
    spec = getattr(args, "model", None)
    if not isinstance(spec, str) or not spec:
        return
    if not Path(spec).expanduser().exists() and not HUB_ID.fullmatch(spec):
        return  # neither a folder nor an ORG/NAME id: the loader names it, after the data's and heads' checks
    folder = checkpoint_folder(spec, getattr(args, "revision", None))
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        model_type = config.get("model_type")
    except (OSError, ValueError, AttributeError) as err:
        raise OptionError(f"--model {spec}: config.json does not read as a JSON object ({err})") from None
    if isinstance(config, dict) and ("auto_map" in config or config.get("trust_remote_code")):
        raise UnsupportedModelError(
            f"--model {spec}: the checkpoint asks to run its own code (auto_map, trust_remote_code); "
            "corelens does not run checkpoint code"
        )
    supported = supported_types()
    if model_type not in supported:
        raise UnsupportedModelError(
            f"--model {spec}: model_type {model_type!r} (config.json) is not a supported vision-language "
            f"family; supported: {', '.join(supported)} (docs/families.md)"
        )
    check_sizes(args, config)


def check_rerun(command: str, config: object, out: str | Path | None, add_config) -> None:
    """Refuse, before torch loads, a run folder `out` that holds another command, or this command's run with
    other settings: the refusal the run folder itself gives once the model is loaded (`runs.rundir.Run`).

    The earlier run's options are its recorded command line (`argv`) parsed again as this command's config
    (`add_config(parser, Config)` adds its options);
    an option counts where the manifest's settings hold a setting of its name (so that the run folder would
    refuse the change too), and a folder whose run logged no sample yet never blocks (it starts afresh).
    Anything that cannot be read or parsed is left to the run folder's own check.
    """
    import dataclasses

    from corelens.data import jsonfile
    from corelens.runs.fields import settings
    from corelens.runs.rundir import MANIFEST, unstarted

    folder = Path(out) if out is not None else None
    if folder is None or not (folder / MANIFEST).is_file():
        return
    try:
        old = jsonfile.load(folder / MANIFEST)
    except Exception:  # a damaged manifest: the run folder's own check names it
        return
    if not isinstance(old, dict) or unstarted(folder, old):
        return
    refuse = f"{folder} holds a {old.get('command')!r} run with other settings"
    if old.get("command") != command:
        raise OptionError(f"{refuse} (command); use another --out or delete it")
    argv, recorded = old.get("argv"), old.get("settings")
    if not isinstance(argv, list) or command not in argv or not isinstance(recorded, dict):
        return
    parser = _Quiet(add_help=False, exit_on_error=False)
    add_config(parser, type(config))
    try:
        parsed = parser.parse_known_args([str(a) for a in argv[argv.index(command) + 1 :]])[0]
        before = settings(
            dataclasses.replace(config, **{k: v for k, v in vars(parsed).items() if hasattr(config, k)})
        )
    except (argparse.ArgumentError, TypeError, ValueError):
        return  # an option since renamed or a file since moved: the run folder's check decides
    now = settings(config)
    changed = sorted(k for k in now if k in recorded and before[k] != now[k])
    if changed:
        raise OptionError(f"{refuse} ({', '.join(changed)}); use another --out or delete it")


class _Quiet(argparse.ArgumentParser):
    """A parser that raises on a bad command line instead of printing its usage and exiting."""

    def error(self, message: str):
        raise argparse.ArgumentError(None, message)
