"""`python -m corelens.integrations.lmms_eval SAMPLES.jsonl --out DIR`: write a local lmms-eval task folder."""

from __future__ import annotations

import argparse
import shlex
import sys

from corelens.errors import CorelensError
from corelens.integrations.lmms_eval.task import write_task
from corelens.metrics.answers import SCORERS


def main(argv: list[str] | None = None) -> int:
    """Write the task folder; print how to run it."""
    p = argparse.ArgumentParser(prog="python -m corelens.integrations.lmms_eval", description=__doc__)
    p.add_argument("samples", help="a corelens sample file (JSONL) with images and answers")
    p.add_argument("--out", required=True, help="task folder to write (pass it as --include_path)")
    p.add_argument("--task", default="corelens_samples", help="task name")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--scorer", choices=SCORERS, default="auto")
    args = p.parse_args(argv)
    try:
        yaml = write_task(
            args.samples, args.out, args.task, max_new_tokens=args.max_new_tokens, scorer=args.scorer
        )
    except CorelensError as err:
        print(f"corelens: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {yaml}; run: python -m lmms_eval --model corelens --model_args pretrained=MODEL "
          f"--tasks {args.task} --include_path {shlex.quote(str(args.out))}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
