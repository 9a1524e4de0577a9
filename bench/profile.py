"""Where one short request's time goes in the server: py-spy samples `headwise serve` while one
client sends the benchmark's shortest text, then the samples are summed per thread and, for the
event-loop thread, per package.

python -m bench.profile --bundle B [--seconds 12] [--raw FILE]

py-spy (in the `bench` extra) needs ptrace rights over the server: root, or
kernel.yama.ptrace_scope=0. Wall-clock samples, idle included: a thread's share is the time it
was busy (or descheduled while runnable) per request.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from bench import baselines, corpus
from bench.loadgen import build_requests, run_load
from bench.server import launch

IDLE = ("Runner.run", "_worker (concurrent/futures/thread.py:81)", "Condition.wait")


def summarise(raw: str, requests: int, seconds: float) -> str:
    """Per thread: busy samples per request; for the event loop, busy samples by package."""
    threads: Counter[str] = Counter()
    busy: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        thread = re.sub(r"thread \(\d+\): ", "", frames[0])
        threads[thread] += int(count)
        if frames[-1].startswith(IDLE):
            continue
        busy[thread] += int(count)
        if thread == "MainThread":
            m = re.search(r"\(([^:)]+)", frames[-1])
            parts = (m.group(1) if m else "?").split("/")
            key = "/".join(parts[:2]) if parts[0] == "service" else parts[0]
            packages[key] += int(count)
    per_thread = max(threads.values())
    lines = [f"{requests} requests in {seconds:g} s: {seconds / requests * 1e3:.2f} ms each", ""]
    lines += ["| thread | busy share | ms per request |", "| --- | ---: | ---: |"]
    for thread, n in busy.most_common():
        share = n / per_thread
        lines.append(f"| {thread} | {share * 100:.1f} % | {share * seconds / requests * 1e3:.2f} |")
    total = sum(packages.values())
    lines += ["", "| event loop, busy in | share |", "| --- | ---: |"]
    for key, n in packages.most_common(15):
        lines.append(f"| {key} | {n / total * 100:.1f} % |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile")
    p.add_argument("--bundle", type=Path, default=Path("bundles/default"))
    p.add_argument("--seconds", type=int, default=12)
    p.add_argument("--raw", type=Path, default=Path("bench/results/profile.txt"))
    args = p.parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    texts = corpus.sentences(512)
    sequences = baselines.tokenize(args.bundle / "tokenizer.json", texts)
    short = texts[min(range(len(texts)), key=lambda i: len(sequences[i]))]
    proc, url = launch(args.bundle, {"HEADWISE_ATTENTION_ENABLED": "false"})
    try:
        requests = build_requests(url, "/encode", [short])
        asyncio.run(run_load(url, requests, 1, 300))
        args.raw.parent.mkdir(parents=True, exist_ok=True)
        sampler = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(proc.pid),
                "--rate",
                "1000",
                "--duration",
                str(args.seconds),
                "--format",
                "raw",
                "--threads",
                "--idle",
                "--nonblocking",
                "--output",
                str(args.raw),
            ],
            stdout=subprocess.DEVNULL,
        )
        sent = 0

        async def drive() -> None:
            nonlocal sent
            while sampler.poll() is None:
                r = await run_load(url, requests, 1, 200)
                sent += r.requests

        asyncio.run(drive())
    finally:
        proc.terminate()
        proc.wait(60)
    print(summarise(args.raw.read_text(), sent, args.seconds))  # noqa: T201 - the summary is the output
    return 0


if __name__ == "__main__":
    sys.exit(main())
