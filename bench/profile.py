"""Where one short request's time goes: first by stage, from the server's own timing headers
(one client, the benchmark's shortest text, each request timed by the client too); then py-spy
samples `headwise serve` under the same load and sums the samples per thread and, for the
event-loop thread, per package.

python -m bench.profile --bundle B [--seconds 12] [--raw FILE] [--no-spy] [--clients 32]

--clients N adds the server under load: N clients sending one text a request, each of the
server's threads' CPU time (from /proc, no sampler) per request answered, and the load
generator's own: what the event loop costs a request when it shares the cores with the runs.

py-spy (in the `bench` extra) needs ptrace rights over the server: root, or
kernel.yama.ptrace_scope=0. Wall-clock samples, idle included: a thread's share is the time it
was busy (or descheduled while runnable) per request.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from bench import baselines, corpus
from bench.loadgen import build_requests, run_load
from bench.server import cpu_seconds, launch

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


def threads_cpu(pid: int) -> dict[int, float]:
    """CPU seconds so far of each of the process's threads, by thread id."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = cpu_seconds(pid, int(task.name))
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
    return out


def loaded_table(
    pid: int,
    before: dict[int, float],
    after: dict[int, float],
    requests: int,
    seconds: float,
    client_s: float,
) -> str:
    """Each thread's CPU over the run: share of a core and ms per request (the event loop is
    the main thread: its id is the process's), the load generator's last."""
    lines = [
        f"{requests} requests in {seconds:.1f} s: {requests / seconds:.0f} a second",
        "",
        "| thread | CPU, share of a core | CPU ms per request |",
        "| --- | ---: | ---: |",
    ]
    used = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    for tid, cpu in sorted(used.items(), key=lambda kv: -kv[1]):
        if cpu < 0.01 * seconds:
            continue
        name = "event loop (main thread)" if tid == pid else f"thread {tid}"
        lines.append(f"| {name} | {cpu / seconds * 100:.0f} % | {cpu / requests * 1e3:.3f} |")
    lines.append(
        f"| load generator | {client_s / seconds * 100:.0f} % | {client_s / requests * 1e3:.3f} |"
    )
    total = sum(used.values()) + client_s
    lines += ["", f"All together {total / seconds * 100:.0f} % of a core."]
    return "\n".join(lines)


def under_load(
    url: str, pid: int, texts: list[str], clients: int, total: int, per_request: int = 1
) -> str:
    requests = build_requests(url, "/encode", texts, per_request=per_request)
    asyncio.run(run_load(url, requests, clients, min(total, 500)))  # warm, batches refitted
    before, cpu0, t0 = threads_cpu(pid), time.process_time(), time.monotonic()
    r = asyncio.run(run_load(url, requests, clients, total))
    seconds, client_s = time.monotonic() - t0, time.process_time() - cpu0
    table = loaded_table(pid, before, threads_cpu(pid), r.requests, seconds, client_s)
    each = "one text" if per_request == 1 else f"{per_request} texts"
    return f"{clients} clients, {each} a request\n\n{table}"


STAGES = ("x-tokenization-time", "x-queue-time", "x-inference-time", "x-total-time")


def timed_requests(url: str, request: bytes, n: int, warm: int = 100) -> list[dict[str, float]]:
    """n requests, one at a time on one connection: the client's ms and the server's headers."""
    parts = urlsplit(url)
    rows = []
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stream = sock.makefile("rb")
        for i in range(warm + n):
            t0 = time.perf_counter()
            sock.sendall(request)
            stream.readline()
            headers = {}
            while (line := stream.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            stream.read(int(headers["content-length"]))
            client_ms = (time.perf_counter() - t0) * 1e3
            if i >= warm:
                rows.append({"client": client_ms, **{k: float(headers[k]) for k in STAGES}})
    return rows


def stages(rows: list[dict[str, float]]) -> str:
    """Medians per stage: the model's run, the app around it, and what lies outside the app
    (the socket both ways, uvicorn's parsing, the client)."""
    med = {k: statistics.median(r[k] for r in rows) for k in ("client", *STAGES)}
    app = med["x-total-time"] - med["x-inference-time"] - med["x-queue-time"]
    parts = [
        ("model run (x-inference-time)", med["x-inference-time"]),
        ("queued (x-queue-time)", med["x-queue-time"]),
        ("tokenising (x-tokenization-time)", med["x-tokenization-time"]),
        ("rest of the app: parse, route, pipeline, respond", app - med["x-tokenization-time"]),
        ("outside the app: socket, uvicorn, client", med["client"] - med["x-total-time"]),
    ]
    lines = [f"{len(rows)} requests, medians; client-side total {med['client']:.3f} ms", ""]
    lines += ["| stage | ms | share |", "| --- | ---: | ---: |"]
    lines += [f"| {name} | {ms:.3f} | {ms / med['client'] * 100:.0f} % |" for name, ms in parts]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile")
    p.add_argument("--bundle", type=Path, default=Path("bundles/default"))
    p.add_argument("--seconds", type=int, default=12)
    p.add_argument("--raw", type=Path, default=Path("bench/results/profile.txt"))
    p.add_argument("--requests", type=int, default=1000, help="for the stage table")
    p.add_argument("--spy", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--clients", type=int, default=0, help="also the threads' CPU under load")
    p.add_argument("--loaded-requests", type=int, default=3000)
    p.add_argument("--per-request", type=int, default=1, help="texts a request under load")
    args = p.parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    texts = corpus.sentences(512)
    sequences = baselines.tokenize(args.bundle / "tokenizer.json", texts)
    short = texts[min(range(len(texts)), key=lambda i: len(sequences[i]))]
    proc, url = launch(args.bundle, {"HEADWISE_ATTENTION_ENABLED": "false"})
    try:
        requests = build_requests(url, "/encode", [short])
        print(stages(timed_requests(url, requests[0], args.requests)))  # noqa: T201 - output
        if args.clients:
            table = under_load(
                url, proc.pid, texts, args.clients, args.loaded_requests, args.per_request
            )
            print(f"\n{table}")  # noqa: T201 - output
        if not args.spy:
            return 0
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
    print()  # noqa: T201
    print(summarise(args.raw.read_text(), sent, args.seconds))  # noqa: T201 - the summary is the output
    return 0


if __name__ == "__main__":
    sys.exit(main())
