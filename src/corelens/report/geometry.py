"""Figures of the residual-geometry experiments: per-layer RID / MixIG curves and SAP accuracies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from corelens.report.figure import plt, save_figure

# (baseline, module) -> legend label and line style
_CURVES = (
    ("none", "attn", "attention", "-"),
    ("none", "ffn", "FFN", "-"),
    ("noise-delta", "attn", "noise Δ (attention)", "--"),
    ("noise-qkv", "attn", "noise QKV (attention)", "--"),
)


def flow_curves(layers: pd.DataFrame, path: str | Path) -> Path:
    """Write per-layer mean RID and MixIG curves (attention, FFN, noise baselines, ε_RoPE) to a PNG."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for baseline, module, label, style in _CURVES:
        part = layers[(layers["baseline"] == baseline) & (layers["module"] == module)].sort_values("layer")
        if part.empty:
            continue
        axes[0].plot(part["layer"], part["rid"], style, marker="o", ms=3, label=label)
        axes[1].plot(part["layer"], part["mixig"], style, marker="o", ms=3, label=label)
    rope = layers[(layers["baseline"] == "none") & (layers["module"] == "rope")].sort_values("layer")
    if not rope.empty:
        axes[0].plot(rope["layer"], rope["rid"], ":", color="grey", label="ε_RoPE")
    axes[0].set_title("RID per layer")
    axes[1].set_title("MixIG per layer")
    for ax in axes:
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[1].axhline(0.0, color="black", lw=0.6)
    axes[0].legend(fontsize=8)
    return save_figure(fig, path)


def sap_accuracy(accuracy: pd.DataFrame, path: str | Path) -> Path:
    """Write a bar chart of accuracy per SAP condition (95 % Wilson intervals), vanilla first."""
    names = accuracy["condition"].tolist()
    acc = accuracy["accuracy"].to_numpy(float)
    low = acc - accuracy["ci_low"].to_numpy(float)
    high = accuracy["ci_high"].to_numpy(float) - acc
    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(names) + 2), 3.8))
    colours = ["black" if n == "vanilla" else "tab:blue" for n in names]
    ax.bar(np.arange(len(names)), acc, yerr=[low, high], color=colours, capsize=3)
    ax.set_xticks(np.arange(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.set_title("SAP: accuracy per prior and layer set")
    return save_figure(fig, path)
