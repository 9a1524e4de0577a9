"""python -m bench.compare --a URL --b URL [--clients 1,32] [--rounds 4]

Two running servers under the same /encode load, in alternating rounds (A, B, A, B, ...) so that
drift in the machine's load falls on both: throughput and p50 latency of each, and B/A. Used to
show what a change costs: an old build against a new one, or a setting turned on (access log).
"""

from __future__ import annotations

import argparse
import logging
import statistics

from bench import corpus
from bench.__main__ import load

log = logging.getLogger("bench.compare")


def compare(a: str, b: str, clients: int, rounds: int, requests: int, texts: list[str]) -> dict:
    rate = {"a": [], "b": []}
    p50 = {"a": [], "b": []}
    for _ in range(rounds):
        for key, url in (("a", a), ("b", b)):
            r = load(url, "/encode", texts, clients, requests)
            if r.errors:
                raise RuntimeError(f"{url}: {r.errors} errors ({r.statuses})")
            rate[key].append(r.rps)
            p50[key].append(r.percentile(50))
    out = {
        k: {"texts_per_s": statistics.median(rate[k]), "p50_ms": statistics.median(p50[k]) * 1e3}
        for k in rate
    }
    out["b_over_a_throughput"] = out["b"]["texts_per_s"] / out["a"]["texts_per_s"]
    out["b_over_a_p50"] = out["b"]["p50_ms"] / out["a"]["p50_ms"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.compare")
    p.add_argument("--a", required=True, help="baseline server URL")
    p.add_argument("--b", required=True, help="server under test URL")
    p.add_argument("--clients", default="1,32")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--requests", type=int, default=600, help="requests per round")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    texts = corpus.sentences(512)
    for c in (int(x) for x in args.clients.split(",")):
        r = compare(args.a, args.b, c, args.rounds, args.requests, texts)
        log.info(
            "%3d clients: A %.0f texts/s p50 %.2f ms | B %.0f texts/s p50 %.2f ms | "
            "B/A throughput %.3f, p50 %.3f",
            c, r["a"]["texts_per_s"], r["a"]["p50_ms"], r["b"]["texts_per_s"],
            r["b"]["p50_ms"], r["b_over_a_throughput"], r["b_over_a_p50"],
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
