"""HEADWISE_WORKERS: several server processes on one port, and the process that keeps them.

One process answers requests on one event loop: on 16 cores of a Xeon it answered ~565
one-text requests a second whatever the graph (bench/results/runtimes-amx-16.md), where the
graph alone ran several times that. Workers are whole servers (`serve`), each accepting on a
socket of its own bound to the one port with SO_REUSEPORT, which the supervisor binds and
hands it: the kernel spreads new connections evenly over them. One listening socket shared by
all (uvicorn's --workers) spread them unevenly: 32 clients connecting at once mostly reached
the worker that woke first (bench.workers: 0.90-1.28x one process's texts/s, where clients
split evenly by hand gave 1.18x). The price: connections still waiting to be accepted by a
worker that dies are reset (those it had accepted die with it either way), and so are those that
reach its socket before the kernel closes it: a killed worker's socket closes with the last of
its threads, measured up to 7 ms after its main thread shows as a zombie. From then on new
connections go to the others (tests/service/http/test_workers.py), and the worker is restarted:
its replacement listens only once it is ready (its models warmed and timed), so that until then
the others take every connection (one that listened at once answered them 503 not ready).
Each worker has its own models, its
slice of the CPUs (service/engine/cpu.share: pinned where affinity limits the process, threads
split where a container's quota does) and its share of the memory limit and of the connection
and request limits, so that the whole stays within what one process was given.

The supervisor (this process) loads no model. It starts the workers (spawned: fresh
interpreters, no threads forked), forwards SIGTERM / SIGINT to them (each drains as one server
does: every accepted request answered), restarts one that dies after it came up, and stops
with exit 1 when one cannot come up (a port taken, a model that does not fit). Metrics are
Prometheus's multiprocess files in a folder of its own (service/metrics.py): any worker's
/metrics adds up every worker's.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Event
from types import FrameType
from typing import Any

from service.engine.memory import memory_limit
from service.metrics import MULTIPROC_ENV
from service.settings import Settings

log = logging.getLogger("headwise")

POLL_S = 0.2
# A worker's body: (its settings' overrides, its index, its socket, set once it listens, whether
# it replaces one that died: then it listens only once ready, the workers' came-up flags).
Worker = Callable[[dict[str, Any], int, socket.socket, Event, bool, Any], None]


@dataclass(frozen=True)
class Peers:
    """The workers on the port, as one worker sees them: a flag each, set once it came up
    (ready the first time; a replacement finds its predecessor's set), in memory the supervisor
    shares with all. Readiness probes answer ready only when every flag is set: at start one
    worker is ready seconds before another, and the port would say ready while the other
    answered its share of connections 503 not ready."""

    flags: Any  # multiprocessing's Array("b", workers)
    index: int

    def came_up(self) -> None:
        self.flags[self.index] = 1

    def all_up(self) -> bool:
        return all(self.flags)


def worker_settings(settings: Settings, overrides: dict[str, Any]) -> dict[str, Any]:
    """What each worker is given: the limits one process had, split between them (the memory
    limit resolved here, from the setting or the container's cgroup, before it is split)."""
    n = settings.workers
    limit, _ = memory_limit(settings.memory_limit_bytes)
    return {
        **overrides,
        "memory_limit_bytes": limit // n,  # 0: not checked, as for one process without a limit
        "max_connections": max(16, settings.max_connections // n),
        "max_concurrency": max(1, settings.max_concurrency // n),
        "verify_bundle": False,  # checked once, by the supervisor
    }


def listening_socket(host: str, port: int) -> socket.socket:
    """host:port bound for one worker to accept on (it listens: uvicorn calls listen), beside
    the other workers' (SO_REUSEPORT); OSError where something else holds the port."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    sock.set_inheritable(True)
    return sock


def die_with_parent() -> None:
    """SIGTERM (a drain) to this process when its parent dies, even killed (Linux's prctl)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        log.warning("a worker cannot ask to be stopped with its supervisor on this system")


class Supervisor:
    def __init__(self, settings: Settings, overrides: dict[str, Any], target: Worker) -> None:
        self.target = target
        self.host, self.port = settings.host, settings.port
        self.count = settings.workers
        self.overrides = worker_settings(settings, overrides)
        self.context = multiprocessing.get_context("spawn")
        self.workers: list[tuple[multiprocessing.process.BaseProcess, Event]] = []
        self.up = self.context.Array("b", self.count, lock=False)  # Peers' flags
        self.stopping = False
        self.failed = False

    def start(
        self, index: int, sock: socket.socket | None = None
    ) -> tuple[multiprocessing.process.BaseProcess, Event]:
        """Worker `index` on a new socket of the port (`sock`: one bound already; none: it
        replaces one that died, and listens only once ready, so that the others answer
        meanwhile rather than it answering 503 not ready)."""
        replaces = sock is None
        sock = sock or listening_socket(self.host, self.port)
        started = self.context.Event()
        proc = self.context.Process(
            target=self.target,
            args=(self.overrides, index, sock, started, replaces, self.up),
            name=f"headwise-worker-{index + 1}",
        )
        proc.start()
        sock.close()  # the worker holds it (multiprocessing passed it a duplicate)
        return proc, started

    def signal(self, sig: int, frame: FrameType | None) -> None:
        """Each worker drains on the first signal and stops at once on a second, as one does."""
        self.stopping = True
        for proc, _ in self.workers:
            if proc.pid is not None and proc.is_alive():
                os.kill(proc.pid, sig)

    def run(self, folder: str, sockets: list[socket.socket]) -> int:
        from prometheus_client import multiprocess

        self.workers = [self.start(i, sock) for i, sock in enumerate(sockets)]
        if self.stopping:  # a signal while they were being started
            self.signal(signal.SIGTERM, None)
        codes: dict[int, int] = {}
        while True:
            for index, (proc, started) in enumerate(self.workers):
                if proc.is_alive() or index in codes:
                    continue
                code = proc.exitcode if proc.exitcode is not None else 1
                if proc.pid is not None:
                    multiprocess.mark_process_dead(proc.pid, folder)  # type: ignore[no-untyped-call]
                if self.stopping:
                    codes[index] = code
                elif not started.is_set():
                    log.error("worker %d exited (%d) before it came up: stopping", index + 1, code)
                    self.failed = True
                    self.signal(signal.SIGTERM, None)
                    codes[index] = code
                else:
                    log.warning(
                        "worker %d (pid %s) exited (%d): restarting", index + 1, proc.pid, code
                    )
                    try:
                        self.workers[index] = self.start(index)
                    except OSError as exc:
                        log.error("cannot restart worker %d: %s: stopping", index + 1, exc)
                        self.failed = True
                        self.signal(signal.SIGTERM, None)
                        codes[index] = code
            if len(codes) == self.count:
                return 1 if self.failed or any(codes.values()) else 0
            time.sleep(POLL_S)


def supervise(settings: Settings, overrides: dict[str, Any], target: Worker) -> int:
    """Serve with `settings.workers` processes, each running `target` (service.http.server's
    run_worker: passed in, a module-level function the spawned process imports by name)."""
    sockets: list[socket.socket] = []
    try:  # all bound before any worker starts: a port held elsewhere fails here, at once
        for _ in range(settings.workers):
            sockets.append(listening_socket(settings.host, settings.port))
    except OSError as exc:
        log.error("cannot serve: %s:%d: %s", settings.host, settings.port, exc)
        for sock in sockets:
            sock.close()
        return 1
    folder = tempfile.mkdtemp(prefix="headwise-metrics-")
    os.environ[MULTIPROC_ENV] = folder  # the workers, spawned after this, inherit it
    supervisor = Supervisor(settings, overrides, target)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, supervisor.signal)
    log.info("%d workers on %s:%d", settings.workers, settings.host, settings.port)
    try:
        return supervisor.run(folder, sockets)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
