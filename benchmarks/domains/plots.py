"""The per-domain benchmark's charts (`report.write_report` draws them beside its tables): speed-ups per
domain and method, and each drafter's accepted length per step; and the grouped bars the serving
benchmarks draw too (`bar_plot`). They read plain series, not the report's summaries."""

from __future__ import annotations

import statistics
from pathlib import Path

from matplotlib.figure import Figure

from benchmarks.domains.names import is_peer


def grouped_bars(ax, groups: list[str], series: dict[str, list[float | None]], ylabel: str, title: str,
                 baseline: float | None = 1.0) -> None:
    """One bar per series in each group, labelled with its value (the peers hatched)."""
    width = 0.8 / max(1, len(series))
    for j, (name, values) in enumerate(series.items()):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(groups))]
        bars = ax.bar(xs, [v or 0.0 for v in values], width, label=name,
                      hatch="//" if is_peer(name) else None, edgecolor="black", linewidth=0.4)
        ax.bar_label(bars, [f"{v:.2f}" if v is not None else "" for v in values], fontsize=6, rotation=90, padding=2)
    if baseline is not None:
        ax.axhline(baseline, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.margins(y=0.12)  # room for the value labels
    ax.set_title(title)


def bar_plot(path: Path, groups: list[str], series: dict[str, list[float | None]], ylabel: str, title: str,
             baseline: float | None = 1.0) -> None:
    """A one-panel grouped bar chart saved as a PNG."""
    fig = Figure(figsize=(max(6.0, 1.2 * len(groups) * max(1, len(series)) / 3), 4.2), layout="constrained")
    ax = fig.subplots()
    grouped_bars(ax, groups, series, ylabel, title, baseline)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(path, dpi=120)


def plot_speedup(domains: list[str], speedups: dict[str, dict[str, list[float | None]]], path: Path) -> None:
    """One panel per baseline (`speedups`: its title -> each method's speed-up per domain), side by side."""
    fig = Figure(figsize=(6 * len(speedups), 4.5), layout="constrained")
    axes = fig.subplots(1, len(speedups), squeeze=False)[0]
    for ax, (title, series) in zip(axes, speedups.items()):
        grouped_bars(ax, domains, series, "speedup (median tok/s ratio)", f"Speedup {title}")
    axes[-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(path, dpi=120)


def plot_accepted(results: dict, method: str, path: Path) -> bool:
    """Histogram of accepted draft tokens per step, one panel per domain; False when there is nothing to plot."""
    cells = [c for c in results["cells"] if c["method"] == method
             and sum(r.get("draft_tokens") or 0 for r in c["prompts"]) > 0]  # `none` never drafts
    per_domain = {c["domain"]: [a for r in c["prompts"] for a in (r.get("accepted_per_step") or [])] for c in cells}
    per_domain = {d: v for d, v in per_domain.items() if v}
    if not per_domain:
        return False
    k = max(int(results.get("k") or 0), max(max(v) for v in per_domain.values()))
    fig = Figure(figsize=(4 * len(per_domain), 3.4), layout="constrained")
    axes = fig.subplots(1, len(per_domain), squeeze=False, sharey=True)[0]
    for ax, (domain, accepted) in zip(axes, per_domain.items()):
        counts = [accepted.count(i) / len(accepted) for i in range(k + 1)]
        ax.bar(range(k + 1), counts, color="tab:blue", edgecolor="black", linewidth=0.4)
        ax.set_xticks(range(k + 1))
        ax.set_xlabel("accepted draft tokens in a step")
        ax.set_title(f"{domain}: mean {statistics.fmean(accepted):.2f} over {len(accepted)} steps", fontsize=10)
    axes[0].set_ylabel("share of steps")
    fig.suptitle(f"{method}: accepted length per step (k = {results.get('k', '?')})")
    fig.savefig(path, dpi=120)
    return True
