"""An experiment command's run on a loaded model (kept apart from configs.py, which imports no torch)."""

from __future__ import annotations

from corelens.runs.context import RunContext


def run_loaded(entry, config, ctx: RunContext, load_options: dict, *args):
    """An experiment command's run: load the config's model (with `load()`'s `load_options`) and call
    `entry(model, config.data, *args, ctx=ctx, **config.kwargs())`."""
    from corelens.models.loaded import load

    return entry(load(config.model, **load_options), config.data, *args, ctx=ctx, **config.kwargs())
