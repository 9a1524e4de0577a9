"""The markdown table: every figure as a ratio against a baseline measured in the same run."""

from __future__ import annotations


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "n/a"


def render(r: dict) -> str:
    direct = r["graph_direct"]
    st = r.get("sentence_transformers")
    peak = r["gemm_peak_gflops"]
    flops = r["flops_per_text"]
    http = {run["concurrency"]: run for run in r["http"]}
    c32 = http.get(32) or http.get(max(http))
    lines = [
        f"headwise bench · {r['model']} · {r['corpus']['texts']} real sentences "
        f"({r['corpus']['tokens_min']}-{r['corpus']['tokens_max']} tokens, mean {r['corpus']['tokens_mean']:.1f}) "
        f"· {r['machine']['cores']} cores",
        "",
        "| what | texts/s | GFLOP/s | vs graph direct | vs sentence-transformers |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| graph called directly, length-sorted batches of 32 | {direct:.0f} | {direct * flops / 1e9:.0f} | 1.00x | {_ratio(direct, st)} |",
    ]
    if st:
        lines.append(
            f"| sentence-transformers encode(batch_size=32) | {st:.0f} | {st * flops / 1e9:.0f} | {_ratio(st, direct)} | 1.00x |"
        )
    if "int8" in r:
        i8 = r["int8"]
        lines.append(
            f"| int8 graph directly ({i8.get('quantised', '?')} nodes int8, {i8.get('kept_fp32', '?')} fp32) | "
            f"{i8['graph_direct']:.0f} | - | {_ratio(i8['graph_direct'], direct)} | {_ratio(i8['graph_direct'], st)} |"
        )
    for run in r["http"]:
        lines.append(
            f"| headwise HTTP /encode, 1 text/request, {run['concurrency']} clients | {run['texts_per_s']:.0f} | "
            f"{run['texts_per_s'] * flops / 1e9:.0f} | {_ratio(run['texts_per_s'], direct)} | {_ratio(run['texts_per_s'], st)} |"
        )
    h8 = r.get("int8", {}).get("http")
    if h8:
        lines.append(
            f"| headwise HTTP /encode, int8, 1 text/request, {h8['concurrency']} clients | {h8['int8_texts_per_s']:.0f} | "
            f"- | {_ratio(h8['int8_texts_per_s'], direct)} | {_ratio(h8['int8_texts_per_s'], st)} |"
        )
    if "peer" in r:
        p = r["peer"]
        lines.append(
            f"| peer {p['url']} /v1/embeddings, 32 clients | {p['texts_per_s']:.0f} | - | {_ratio(p['texts_per_s'], direct)} | {_ratio(p['texts_per_s'], st)} |"
        )
    lines += [
        "",
        "| HTTP run | p50 ms | p95 ms | p99 ms | mean batch | padding | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in r["http"]:
        pad = f"{run['padding_ratio'] * 100:.1f} %" if run["padding_ratio"] is not None else "n/a"
        batch = f"{run['mean_batch']:.1f}" if run["mean_batch"] else "n/a"
        lines.append(
            f"| {run['concurrency']} clients | {run['p50_ms']:.1f} | {run['p95_ms']:.1f} | {run['p99_ms']:.1f} | {batch} | {pad} | {run['errors']} |"
        )
    lines += _quality(r.get("int8", {}))
    lines += ["", "| target | measured | goal |", "| --- | ---: | --- |"]
    if c32:
        lines.append(
            f"| HTTP {c32['concurrency']} clients vs graph direct | {_ratio(c32['texts_per_s'], direct)} | >= 0.9x |"
        )
        lines.append(
            f"| HTTP {c32['concurrency']} clients vs sentence-transformers | {_ratio(c32['texts_per_s'], st)} | >= 1.2x |"
        )
        if "peer" in r:
            lines.append(
                f"| HTTP vs peer server | {_ratio(c32['texts_per_s'], r['peer']['texts_per_s'])} | >= 1.4x |"
            )
        if c32["padding_ratio"] is not None:
            lines.append(
                f"| padding share at {c32['concurrency']} clients | {c32['padding_ratio'] * 100:.1f} % | <= 10 % |"
            )
    if "latency_short" in r:
        ls = r["latency_short"]
        direct_ms = ls.get("direct_p50_ms") or r["single_call_latency_s"] * 1e3
        lines.append(
            f"| p50 of one short text ({ls['tokens']} tokens), 1 client, vs one direct call "
            f"({direct_ms:.2f} ms; blocks alternated) | {ls['p50_ms'] / direct_ms:.2f}x "
            f"({ls['p50_ms']:.2f} ms) | <= 1.3x |"
        )
    if "int8" in r:
        i8 = r["int8"]
        lines.append(f"| int8 vs fp32 graph, rounds interleaved | {i8['speedup']:.2f}x | >= 2.0x |")
        if i8.get("http"):
            lines.append(
                f"| int8 vs fp32 HTTP, {i8['http']['concurrency']} clients, runs alternated | "
                f"{i8['http']['speedup']:.2f}x | >= 1.7x |"
            )
        q = i8.get("holdout")
        if q:
            lines.append(
                f"| int8 loss of recall@10 / MRR vs fp32, held-out pairs | "
                f"{q['fp32_recall_at_10'] - q['recall_at_10']:+.2f} / {q['fp32_mrr'] - q['mrr']:+.2f} points | "
                f"<= {q['max_drop_allowed']:g} points |"
            )
            lines.append(
                f"| int8 Spearman of pair similarities vs fp32 | {q['spearman']:.4f} | >= {q['min_spearman_allowed']:g} |"
            )
    lines.append(
        f"| graph direct vs ORT GEMM peak ({peak:.0f} GFLOP/s) | {direct * flops / 1e9 / peak * 100:.0f} % | - |"
    )
    return "\n".join(lines)


def _quality(i8: dict) -> list[str]:
    q = i8.get("holdout")
    if not q:
        return []
    return [
        "",
        f"int8 vs fp32 on {q['pairs']} held-out query -> document pairs ({q['corpus']}; "
        "pairs the export's gate never saw), points of 100:",
        "",
        "| graph | recall@1 | recall@10 | MRR | Spearman vs fp32 | min / mean cosine vs fp32 |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        f"| fp32 | {q['fp32_recall_at_1']:.2f} | {q['fp32_recall_at_10']:.2f} | {q['fp32_mrr']:.2f} | 1 | 1 / 1 |",
        f"| int8 | {q['recall_at_1']:.2f} | {q['recall_at_10']:.2f} | {q['mrr']:.2f} | {q['spearman']:.4f} | "
        f"{q['min_cosine']:.4f} / {q['mean_cosine']:.4f} |",
    ]
