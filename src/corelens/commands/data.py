"""`corelens data convert`: a dataset in its native format -> corelens samples (JSONL + images);
`corelens data stats`: what a sample file, converted dataset or run holds (counts, skips, tokens)."""

from __future__ import annotations

import argparse
import json

from corelens.commands.argtypes import output_path, samples_path


def json_object(text: str) -> dict:
    """argparse `type` of --options: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err.msg}): {text}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f'expected a JSON object such as {{"split": "val"}}, got {text}')
    return value


def run_convert(args: argparse.Namespace) -> None:
    """Convert NAME:PATH into the output folder."""
    from corelens.data.readers import convert

    options = dict(args.options or {})
    if args.limit is not None:
        options["limit"] = args.limit
    result = convert(args.spec, args.out, skip_bad=args.skip_bad, **options)
    print(f"wrote {result.n} samples to {result.path}")
    if result.skipped:
        print(
            f"skipped {len(result.skipped)} records, listed with the reason in {result.path.parent / 'skipped.jsonl'}"
        )


def run_stats(args: argparse.Namespace) -> None:
    """Print and write the per-dataset statistics of a run, converted dataset or sample file."""
    from pathlib import Path

    from corelens.data.stats import locate, render, stats
    from corelens.models.prepare import token_counter

    tokens = token_counter(args.model, args.rule) if args.model else None
    result = stats(args.target, tokens, model=args.model)
    print(render(result))
    out = Path(args.out) if args.out else locate(args.target)[2]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out}")


def register(sub) -> None:
    """Add the `data` parser with its `convert` sub-command."""
    d = sub.add_parser("data", help="read datasets in their native formats")
    actions = d.add_subparsers(dest="action", required=True)
    c = actions.add_parser(
        "convert", help="convert refcocog:PATH, vidstg:PATH, mmlongbench:PATH or mmdocir:PATH"
    )
    c.add_argument("spec", help="NAME:PATH, e.g. refcocog:/data/refcocog")
    c.add_argument(
        "--out", type=output_path, required=True, help="folder for the JSONL and any rendered images"
    )
    c.add_argument("--limit", type=int, default=None, help="convert the first N samples")
    c.add_argument(
        "--skip-bad", action="store_true", help="skip and list malformed records instead of stopping"
    )
    c.add_argument(
        "--options",
        type=json_object,
        default=None,
        help='reader options as JSON, e.g. \'{"split": "val"}\' (refcocog: split, template, images; vidstg: '
        "split, fps, max_frames; mmlongbench: max_side, max_pages, pages, keep_unanswerable; mmdocir: level, "
        "max_pages, pages)",
    )
    c.set_defaults(func=run_convert)
    st = actions.add_parser(
        "stats", help="per-dataset counts of a run, converted dataset, sample file or NAME:PATH"
    )
    st.add_argument(
        "target",
        type=samples_path,
        help="a run folder, a converted dataset folder, a sample file or NAME:PATH",
    )
    st.add_argument(
        "--model", default=None, help="checkpoint whose processor counts the prompt, visual and Ω tokens"
    )
    st.add_argument(
        "--rule",
        choices=("any", "centre", "coverage"),
        default="any",
        help="box -> tokens rule for Ω (any, centre, coverage)",
    )
    st.add_argument(
        "--out", type=output_path, default=None, help="JSON file to write (default: beside the data)"
    )
    st.set_defaults(func=run_stats)
