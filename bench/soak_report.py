"""The soak's summary (markdown against the issue's goals) and its curves (PNG)."""

from __future__ import annotations

from pathlib import Path


def _ms(x: float | None) -> str:
    return f"{x:.0f}" if x is not None else "-"


def render(r: dict) -> str:
    lat = r["latency"]
    a, b = lat.get("no_attention", {}), lat.get("attention", {})
    enc_a = a.get("/encode", {}).get("texts_per_s", 0.0)
    enc_b = b.get("/encode", {}).get("texts_per_s", 0.0)
    health_b = b.get("/health", {}).get("p99_ms")
    warm, idle, peak = r["rss_warm_mb"], r["rss_after_idle_mb"], r["rss_peak_mb"]
    bound = r["memory_bound_mb"]
    big = r["encode_2048x200"]
    fives = {
        ep: {s: n for s, n in st.items() if s.startswith("5")} for ep, st in r["statuses"].items()
    }
    lines = [
        f"headwise soak · {r['seconds']:.0f} s · {r['cpus']} cores · load average at start "
        f"{r['load'][0]:.1f} (a shared machine: absolute figures are noisy, ratios are from one run)",
        "",
        "| what | measured | goal |",
        "| --- | ---: | --- |",
        f"| RSS start / warm / peak / after {r.get('idle_s', 60):.0f} s idle (MB) | "
        f"{r['rss_start_mb']:.0f} / {warm:.0f} / {peak:.0f} / {idle:.0f} | |",
        f"| RSS after idle vs warm | {idle / warm:.2f}x | <= 1.3x |",
        f"| peak vs documented bound ({bound:.0f} MB) | {peak / bound:.2f}x | < 1.0x |",
        f"| /encode texts/s with 2 /attention loops vs without | {enc_b:.1f} / {enc_a:.1f} = "
        f"{enc_b / enc_a if enc_a else float('nan'):.2f}x | >= 0.8x |",
        f"| /health p99 under /attention load | {_ms(health_b)} ms | < 50 ms |",
        f"| 2,048 x 200 tokens /encode | {big['status']} in {big['seconds']:.2f} s | 200, or "
        "refused < 1 s naming what to change |",
        f"| queue-depth gauge 0 after the last request | {r['queue_depth_zero_after_s']} s | < 1 s |",
        f"| memory choice's speed: default vs arena /encode texts/s | "
        f"{r['speed_cost']['ratio_default_vs_arena']:.2f}x | measured |",
        f"| 5xx by endpoint | {fives} | only deadline 503s |",
        "",
        f"2,048 x 200 answer: `{big['message'][:300]}`",
        "",
        "| /attention answer, 256 tokens, all layers and heads | status | bytes | seconds (best of 3) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for enc in ("float", "base64_f16", "base64_f32"):
        x = r["attention_sizes"][enc]
        lines.append(f"| {enc} | {x['status']} | {x['bytes']:,} | {x['seconds']:.3f} |")
    lines += ["", "| phase | endpoint | requests | ok | texts/s | p50 ms | p95 ms | p99 ms |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for phase, eps in lat.items():
        for ep, s in sorted(eps.items()):
            lines.append(
                f"| {phase} | {ep} | {s['count']} | {s['ok']} | {s['texts_per_s']:.1f} | "
                f"{_ms(s['p50_ms'])} | {_ms(s['p95_ms'])} | {_ms(s['p99_ms'])} |"
            )
    lines += ["", f"statuses: {r['statuses']}"]
    return "\n".join(lines)


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    t = [s[0] for s in r["samples"]]
    top.plot(t, [s[1] for s in r["samples"]], label="RSS")
    top.plot(t, [s[2] for s in r["samples"]], label="high-water mark", linestyle="--")
    top.axhline(r["memory_bound_mb"], color="red", linewidth=0.8, label="documented bound")
    top.set_ylabel("MB")
    top.legend(loc="upper left")
    for name, at in r["marks"].items():
        for ax in (top, bottom):
            ax.axvline(at, color="grey", linewidth=0.6)
        top.text(at, top.get_ylim()[1] * 0.97, f" {name}", fontsize=8, va="top")
    for endpoint, series in r.get("latency_series", {}).items():
        bottom.plot([x for x, _ in series], [y * 1e3 for _, y in series], ".",
                    markersize=2, label=endpoint)
    bottom.set_yscale("log")
    bottom.set_ylabel("latency ms (each request)")
    bottom.set_xlabel("seconds")
    bottom.legend(loc="upper left", markerscale=4)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
