"""The benchmark's chart: decode tokens/s as grouped bars (one group per prompt type, one bar
per method), each bar labelled with its speedup over our autoregressive decoding."""

from __future__ import annotations

from pathlib import Path


def plot(report: dict, path: str | Path) -> Path:
    # The object-oriented API with the Agg canvas: no display and no global pyplot state.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    types = [*report["config"]["types"], "all"]
    methods = list(report["methods"])
    width = 0.8 / max(len(methods), 1)
    fig = Figure(figsize=(min(16.0, max(6.0, 0.45 * len(types) * max(1, len(methods)))), 5.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    top = 0.0
    for j, label in enumerate(methods):
        rows = report["methods"][label]["types"]
        xs, ys, notes = [], [], []
        for i, t in enumerate(types):
            row = rows.get(t)
            if row is None or row["decode_tokens_per_s"] is None:
                continue
            xs.append(i - 0.4 + width * (j + 0.5))
            ys.append(row["decode_tokens_per_s"])
            sp = row.get("speedup_vs_ar")
            notes.append(f"{sp:.2f}x" if sp else f"{row['decode_tokens_per_s']:.1f}")
        bars = ax.bar(xs, ys, width * 0.92, label=label)
        ax.bar_label(bars, notes, padding=2, fontsize=7)
        top = max([top, *ys])
    ax.set_xticks(range(len(types)), types)
    ax.set_ylim(0, top * 1.15 if top else 1)
    ax.set_ylabel("decode tokens/s")
    cfg, machine = report["config"], report["machine"]
    cpu = machine["cpu"] + (f" ({machine['cpu_core']})" if machine.get("cpu_core") else "")
    ax.set_title(
        f"{Path(cfg['model']).name}, {cfg['dtype']}, {cfg['threads']} threads, "
        f"{cfg['max_tokens']} new tokens, temperature {cfg['temperature']:g}\n{cpu}",
        fontsize=9,
    )
    ax.legend(fontsize=8, ncols=min(4, len(methods)))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path
