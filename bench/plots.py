"""The benchmark's pictures: throughput against clients, latency percentiles (matplotlib, from
the `bench` extra; without it the table and JSON are still written)."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("bench")


def draw(r: dict, stem: Path) -> list[Path]:
    """`stem`-throughput.png and `stem`-latency.png from one run's results."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib not installed (pip install -e '.[bench]'): no plots")
        return []
    runs = r["http"]
    clients = [run["concurrency"] for run in runs]
    title = f"{r['model']} · {r['machine']['cores']} cores"
    written = []

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    ax.plot(clients, [run["texts_per_s"] for run in runs], "o-", label="HTTP /encode, fp32")
    ax.axhline(r["graph_direct"], ls="--", c="gray", label="fp32 graph called directly")
    i8 = r.get("int8", {})
    if "http" in i8:
        h = i8["http"]
        ax.plot(
            [h["concurrency"]],
            [h["fp32_texts_per_s"]],
            "o",
            mfc="none",
            c="C0",
            label="HTTP fp32, runs alternated with int8",
        )
        ax.plot(
            [h["concurrency"]],
            [h["int8_texts_per_s"]],
            "s",
            c="C2",
            label="HTTP int8, runs alternated with fp32",
        )
        ax.axhline(i8["graph_direct"], ls=":", c="C2", label="int8 graph called directly")
    if r.get("sentence_transformers"):
        ax.axhline(r["sentence_transformers"], ls="-.", c="C3", label="sentence-transformers")
    if "peer" in r:
        ax.plot([32], [r["peer"]["texts_per_s"]], "^", c="C4", label="peer server")
    ax.set(
        xscale="log",
        xlabel="concurrent clients (one text per request)",
        ylabel="texts/s",
        title=f"Throughput · {title}",
        ylim=(0, None),
    )
    written.append(_save(plt, fig, ax, clients, stem.with_name(stem.name + "-throughput.png")))

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for key, marker in (("p50_ms", "o-"), ("p95_ms", "s-"), ("p99_ms", "^-")):
        ax.plot(clients, [run[key] for run in runs], marker, label=key.split("_")[0])
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="concurrent clients (one text per request)",
        ylabel="latency, ms",
        title=f"/encode latency, fp32 · {title}",
    )
    written.append(_save(plt, fig, ax, clients, stem.with_name(stem.name + "-latency.png")))
    return written


def _save(plt, fig, ax, clients: list[int], path: Path) -> Path:
    """Clients as the x ticks, a title that fits (a model's name can be long), legend, PNG."""
    ax.set_xticks(clients, [str(c) for c in clients])
    ax.title.set_fontsize(10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
