"""What FastAPI's request machinery costs one request, warm and right after the caches were swept
(as a request finds them after a model run): the reason for service/lane.py.

python -m bench.framework [--calls 600]

Three ways to answer POST /encode with the same body model and no work behind it, each called
in-process as an ASGI app (no sockets): a FastAPI route with the body as a parameter and two
dependencies (the shape of headwise's routes), a FastAPI route that parses the body itself, and
a plain ASGI callable (the lane's way). "cold" sweeps 64 MB before each call. Medians, in µs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Annotated

import numpy as np
import orjson
from fastapi import Depends, FastAPI, Request
from starlette.responses import Response

from service.api.native.schemas import EncodeRequest
from service.http.rehearsal import post_scope

BODY = orjson.dumps({"inputs": "This temporary change affects other threads."})
OK = b'{"ok":true}'


async def _dependency(request: Request) -> object:
    return request.app


Dep = Annotated[object, Depends(_dependency)]


def fastapi_app() -> FastAPI:
    app = FastAPI()

    @app.post("/typed")
    async def typed(body: EncodeRequest, request: Request, a: Dep, b: Dep) -> Response:
        return Response(OK, media_type="application/json")

    @app.post("/parsed")
    async def parsed(request: Request) -> Response:
        EncodeRequest.model_validate_json(await request.body())
        return Response(OK, media_type="application/json")

    return app


async def plain(scope, receive, send) -> None:
    EncodeRequest.model_validate_json((await receive())["body"])
    headers = [(b"content-type", b"application/json"), (b"content-length", b"11")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": OK})


def _scope(app, path: str) -> dict:
    return {**post_scope(path, BODY), "app": app}


async def timed(app, path: str, calls: int, sweep: np.ndarray | None) -> float:
    """Median µs of one call; `sweep` is written through before each call when given."""
    never = asyncio.Event()
    statuses = []

    async def send(message) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    times = []
    for _ in range(calls):
        delivered = False

        async def receive():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": BODY, "more_body": False}
            await never.wait()

        if sweep is not None:
            sweep += 1.0
        t0 = time.perf_counter()
        await app(_scope(app, path), receive, send)
        times.append(time.perf_counter() - t0)
    if set(statuses) != {200}:
        raise RuntimeError(f"{path}: statuses {sorted(set(statuses))}")
    return statistics.median(times) * 1e6


async def measure(calls: int, sweep_mb: int = 64) -> dict[str, dict[str, float]]:
    app = fastapi_app()
    sweep = np.ones(sweep_mb * 2**20 // 8)
    ways = {
        "FastAPI route, body parameter + 2 dependencies": (app, "/typed"),
        "FastAPI route, body parsed in the route": (app, "/parsed"),
        "plain ASGI callable (the lane)": (plain, "/encode"),
    }
    out = {}
    for name, (target, path) in ways.items():
        await timed(target, path, 50, None)
        out[name] = {
            "warm_us": await timed(target, path, calls, None),
            "cold_us": await timed(target, path, calls, sweep),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.framework")
    p.add_argument("--calls", type=int, default=600)
    args = p.parse_args(argv)
    rows = asyncio.run(measure(args.calls))
    lines = ["| way | warm µs | cold µs |", "| --- | ---: | ---: |"]
    lines += [f"| {k} | {v['warm_us']:.1f} | {v['cold_us']:.1f} |" for k, v in rows.items()]
    print("\n".join(lines))  # noqa: T201 - the table is the program's output
    return 0


if __name__ == "__main__":
    sys.exit(main())
