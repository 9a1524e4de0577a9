"""HEADWISE_WORKERS: several server processes on one port (service/http/workers.py), each with
its share of the CPUs and limits, their metrics added up, a dead one replaced, all drained on
SIGTERM; and the CPU split itself (service/engine/cpu.share)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.server import free_port, launch, stop
from service.engine.cpu import Share, share
from service.http.workers import worker_settings
from service.settings import Settings


def test_affinity_is_split_into_consecutive_slices() -> None:
    cpus = list(range(8))
    assert [share(i, 2, cpus, None) for i in range(2)] == [
        Share([0, 1, 2, 3], 4),
        Share([4, 5, 6, 7], 4),
    ]
    # uneven: sizes differ by one, every CPU used once
    parts = [share(i, 3, [2, 3, 5, 7, 11], None) for i in range(3)]
    assert [p.cpus for p in parts] == [[2, 3], [5, 7], [11]]
    assert [p.threads for p in parts] == [2, 2, 1]


def test_more_workers_than_cpus_share_them_round_robin() -> None:
    assert [share(i, 3, [0, 1], None) for i in range(3)] == [
        Share([0], 1),
        Share([1], 1),
        Share([0], 1),
    ]


def test_a_tighter_quota_splits_threads_without_pinning() -> None:
    # limits.cpu 4 on a 16-CPU node: the quota is the container's, any CPU may run it
    assert [share(i, 2, list(range(16)), 4) for i in range(2)] == [Share(None, 2)] * 2
    assert share(1, 2, list(range(16)), 1) == Share(None, 1)  # never 0 threads
    # a quota wider than the affinity does not limit: the slices are the affinity's
    assert share(0, 2, [0, 1], 8) == Share([0], 1)


def test_each_worker_gets_its_share_of_the_limits() -> None:
    s = Settings(workers=4, memory_limit_bytes=8 * 2**30, max_connections=2048, max_concurrency=2)
    got = worker_settings(s, {"workers": 4})
    assert got["memory_limit_bytes"] == 2 * 2**30
    assert got["max_connections"] == 512
    assert got["max_concurrency"] == 1  # at least one each
    assert got["verify_bundle"] is False and got["workers"] == 4
    unchecked = worker_settings(Settings(workers=2, memory_limit_bytes=0), {})
    assert unchecked["memory_limit_bytes"] == 0  # not checked stays not checked


def call(url: str, method: str = "GET", path: str = "/info", body: dict | None = None):
    """One request on a connection of its own (the kernel picks a worker per connection)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, data, {"content-type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def worker_pids(url: str, wanted: int, timeout_s: float = 60) -> set[int]:
    """The pids of the ready workers, asked on fresh connections until `wanted` answer."""
    host, port = url.removeprefix("http://").split(":")
    seen: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:  # both on one connection: one worker's readiness and pid
            conn.request("GET", "/ready")
            ready = conn.getresponse()
            ready.read()
            conn.request("GET", "/info")
            pid = json.loads(conn.getresponse().read())["workers"]["pid"]
        except OSError:
            time.sleep(0.1)
            continue
        finally:
            conn.close()
        if ready.status == 200:
            seen.add(pid)
        if len(seen) >= wanted:
            return seen
        time.sleep(0.02)
    raise AssertionError(f"only {seen} answered within {timeout_s:g} s")


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process `pid` has open."""
    out = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[len("socket:[") : -1])
    return out


def listening(inodes: set[str]) -> set[str]:
    """Those of `inodes` that are TCP sockets still listening (state 0A), whoever holds them."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                found.add(fields[9])
    return found


def gone(pid: int) -> bool:
    """Exited (a zombie not yet reaped has closed its sockets already)."""
    try:
        return "zombie" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True


def metric(text: str, name: str, default: float | None = None, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            head = line.split(" ")[0]
            if head == name or head.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    if default is not None:
        return default
    raise AssertionError(f"{name} {labels} not in /metrics")


@pytest.fixture
def workers(tiny_bundle: Path, tmp_path: Path):
    log = (tmp_path / "serve.log").open("wb")
    env = {"HEADWISE_WORKERS": "2", "HEADWISE_RUNTIME": "onnxruntime", "HEADWISE_LOG_LEVEL": "info"}
    proc, url = launch(tiny_bundle, env, log, 90)
    try:
        yield proc, url, worker_pids(url, 2)
    finally:
        stop(proc)
        log.close()


def test_two_workers_answer_and_metrics_add_up(workers) -> None:
    proc, url, pids = workers
    assert proc.pid not in pids and len(pids) == 2  # the supervisor serves nothing itself
    _, body = call(url)
    info = json.loads(body)
    assert info["workers"]["count"] == 2
    assert info["cpu"]["cores"]["usable"] == max(1, len(os.sched_getaffinity(0)) // 2)
    before = call(url, path="/metrics")[1].decode()
    done = metric(before, "headwise_requests_total", 0.0, endpoint="/encode", status="200")
    for i in range(20):
        status, _ = call(url, "POST", "/encode", {"inputs": f"text number {i}"})
        assert status == 200
    # Whichever worker answers the scrape, it counts both workers' requests.
    for _ in range(6):
        text = call(url, path="/metrics")[1].decode()
        assert (
            metric(text, "headwise_requests_total", endpoint="/encode", status="200") == done + 20
        )
    assert metric(text, "headwise_ready") == 1.0
    rss = metric(text, "process_resident_memory_bytes")
    one = sum(
        int(line.split()[1]) * 1024
        for pid in pids
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    assert 0.8 * one < rss < 1.25 * one  # both workers' resident memory, summed


def test_a_killed_worker_is_replaced(workers) -> None:
    proc, url, pids = workers
    victim = min(pids)
    own = listening(socket_inodes(victim))
    assert own, "the worker listens on a socket of its own"
    os.kill(victim, signal.SIGKILL)
    # Connections that reach its socket before the kernel closes it are reset with it
    # (SO_REUSEPORT: its own socket). That is after its main thread shows as a zombie: the
    # socket closes with the last of its threads (the runtimes' own). Once it is closed, every
    # new connection goes to the other worker, and then to the replacement: none is reset.
    deadline = time.monotonic() + 10
    while (listening(own) or not gone(victim)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not listening(own)
    for i in range(10):
        assert call(url, "POST", "/encode", {"inputs": f"after {i}"})[0] == 200
    now = worker_pids(url, 2, timeout_s=90)
    assert victim not in now and len(now) == 2
    for i in range(10):  # once replaced, every connection is answered
        assert call(url, "POST", "/encode", {"inputs": f"replaced {i}"})[0] == 200
    text = call(url, path="/metrics")[1].decode()
    assert metric(text, "headwise_ready") == 1.0  # the dead worker's gauges are gone
    assert proc.poll() is None


def test_a_replacement_takes_connections_only_once_ready(workers) -> None:
    """While the killed worker's replacement loads and warms its models, the other worker takes
    every new connection: no request is answered 503 not ready."""
    proc, url, pids = workers
    victim = min(pids)
    own = listening(socket_inodes(victim))
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while listening(own) and time.monotonic() < deadline:
        time.sleep(0.01)
    statuses: list[int] = []
    seen: set[int] = set()
    deadline = time.monotonic() + 90
    while len(seen - {victim}) < 2 and time.monotonic() < deadline:  # until the replacement answers
        status, _ = call(url, "POST", "/encode", {"inputs": "while it restarts"})
        statuses.append(status)
        seen.add(json.loads(call(url)[1])["workers"]["pid"])
    assert len(seen - {victim}) == 2, seen
    statuses += [call(url, "POST", "/encode", {"inputs": f"after {i}"})[0] for i in range(20)]
    assert set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}


def test_sigterm_drains_every_worker_and_exits_0(workers) -> None:
    proc, url, pids = workers
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert all(gone(pid) for pid in pids)


def test_a_port_taken_fails_at_once_with_exit_1(tiny_bundle: Path, tmp_path: Path) -> None:
    port = free_port()
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    holder.listen()
    try:
        env = {**os.environ, "HEADWISE_WORKERS": "2", "HEADWISE_RUNTIME": "onnxruntime"}
        cmd = [sys.executable, "-m", "service.cli", "serve", "--bundle", str(tiny_bundle)]
        done = subprocess.run(
            [*cmd, "--host", "127.0.0.1", "--port", str(port)],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        holder.close()
    assert done.returncode == 1
    assert f"cannot serve: 127.0.0.1:{port}" in done.stderr


def test_the_port_says_ready_only_once_every_worker_is(tiny_bundle: Path, tmp_path: Path) -> None:
    """At start each worker warms on its own and one is ready before the other: /ready on the
    port (the kernel picks the worker a connection reaches) answers 503 until both are, then
    200 on every connection; it never says ready and then not ready again (before, a probe that
    reached the ready worker said ready while the other answered its share 503 not ready)."""
    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--bundle", str(tiny_bundle)]
        + ["--port", str(port), "--workers", "2"],
        env={**os.environ, "HEADWISE_RUNTIME": "onnxruntime", "HEADWISE_HOST": "127.0.0.1"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    answers: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and answers[-40:].count(200) < 40:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                status, _ = call(url, path="/ready")
            except OSError:
                time.sleep(0.02)
                continue
            answers.append(status)
            assert status in (200, 503)
    finally:
        stop(proc)
        log.close()
    assert answers[-40:] == [200] * 40, "not ready in time"
    first = answers.index(200)
    assert answers[first:] == [200] * (len(answers) - first), answers
    assert 503 in answers  # asked while warming too
