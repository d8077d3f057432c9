"""`corelens sap`: accuracy with shared attention priors in place of learned visual attention (docs/methods.md#sap)."""

from __future__ import annotations

import argparse
import sys

from corelens.choices import CONVENTIONS, PRIORS, SAP_CONTROLS
from corelens.commands.argtypes import checked, names_of, output_path, samples_path
from corelens.commands.common import (
    add_limit_options,
    add_model_options,
    add_run_options,
    limits_of,
    load_options,
    main_process,
)


def _items(values: list[str] | None, default: tuple[str, ...]) -> list[str]:
    if not values:
        return list(default)
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def _syntax(what: str):
    """Return an argparse `type` checking a layer or head set's syntax; its range waits for the model's sizes."""

    def check(text: str) -> str:
        # Imported here (it imports torch): only a given --layers / --heads is checked, never --help.
        from corelens.attention import priors

        getattr(priors, f"parse_{what}s")(text, 1 << 20)  # any size: only the syntax can be wrong yet
        return text

    return checked(check, f"{what}_set")


layer_set, head_set = _syntax("layer"), _syntax("head")


def run(args: argparse.Namespace) -> None:
    """Run the SAP sweep into a run directory; print accuracy per condition and the key-region ratio."""
    from corelens.experiments.sap import sap_path

    result = sap_path(
        args.model,
        args.data,
        args.out,
        priors=_items(args.prior, PRIORS),
        layers=args.layers or ["late"],
        heads=args.heads,
        convention=args.convention,
        prior_temperature=args.prior_temperature,
        scorer=args.scorer,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        limit=args.limit,
        skip_bad=args.skip_bad,
        limits=limits_of(args),
        progress=True,
        argv=sys.argv,
        load_options=load_options(args),
    )
    if not main_process():
        return
    fmt = {"float_format": lambda v: f"{v:.3f}", "index": False}
    print(result.accuracy.to_string(**fmt))
    print(result.key_region.to_string(**fmt))
    print(result.priors.to_string(**fmt))
    print(
        f"wrote {args.out}/sap.parquet, accuracy.csv, key_region.csv, priors.csv, manifest.json, "
        "figures/sap_accuracy.png"
    )


def register(sub) -> None:
    """Add the `sap` parser."""
    s = sub.add_parser("sap", help="accuracy with attention priors in place of learned visual attention")
    add_model_options(s)
    s.add_argument("--data", type=samples_path, required=True, help="samples (JSONL) with answers")
    s.add_argument("--out", type=output_path, required=True, help="run directory (resumed if it exists)")
    s.add_argument(
        "--prior",
        action="append",
        type=names_of(PRIORS + SAP_CONTROLS, "prior"),
        help=f"comma list or repeated; of {', '.join(PRIORS + SAP_CONTROLS)} (default: the four priors)",
    )
    s.add_argument(
        "--layers",
        action="append",
        type=layer_set,
        help="layer set, repeat for a sweep: all, early, middle, late (default), first:N, last:N, 21-27,29",
    )
    s.add_argument(
        "--heads", type=head_set, default="all", help="all, 0-3,7, or band:P0-P1 (percentiles of visual mass)"
    )
    s.add_argument("--convention", choices=CONVENTIONS, default="mass", help="how the prior is written")
    s.add_argument(
        "--prior-temperature",
        type=float,
        default=1.0,
        help="T of the key and complexity priors, softmax(x / T) of values in [0, 1]: lower is sharper",
    )
    s.add_argument(
        "--scorer",
        choices=("auto", "exact", "choice", "yesno"),
        default="auto",
        help="how an answer is scored: exact match, a choice letter, yes/no; auto picks by the gold answer",
    )
    s.add_argument("--max-new-tokens", type=int, default=8, help="greedy answer length in tokens")
    s.add_argument("--seed", type=int, default=0, help="seed of the noise prior")
    s.add_argument("--limit", type=int, default=None, help="use the first N good samples")
    s.add_argument("--skip-bad", action="store_true", help="log and skip bad samples instead of stopping")
    add_run_options(s)
    add_limit_options(s)
    s.set_defaults(func=run)
