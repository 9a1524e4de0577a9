"""The `headwise` command: `export` and `heads` (need the [export] extra: torch) and `serve` (no
torch)."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable


def _torch_side(module: str, command: str) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        try:
            # By name, so that the service never imports the torch side unless asked to.
            cli = importlib.import_module(module)
        except ImportError as exc:
            logging.getLogger("headwise").error(
                "%s needs the [export] extra (torch, onnx): %s", command, exc
            )
            return 2
        code: int = cli.main(argv)
        return code

    return run


def _serve(argv: list[str]) -> int:
    from service.http.server import serve_command

    p = argparse.ArgumentParser(prog="headwise serve", description="Serve a bundle over HTTP.")
    p.add_argument(
        "--bundle",
        action="append",
        metavar="[NAME=]DIR",
        help="bundle folder to serve; repeat for several models, NAME= names one "
        "(env HEADWISE_BUNDLES, comma-separated; HEADWISE_BUNDLE for one)",
    )
    p.add_argument("--host", help="bind address (env HEADWISE_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (env HEADWISE_PORT, default 8000)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="env HEADWISE_DEVICE")
    p.add_argument(
        "--runtime", choices=["auto", "onnxruntime", "openvino"], help="env HEADWISE_RUNTIME"
    )
    p.add_argument(
        "--precision", choices=["auto", "fp32", "fp16", "bf16", "int8"], help="env HEADWISE_PRECISION"
    )
    p.add_argument(
        "--workers", type=int, help="server processes on the port (env HEADWISE_WORKERS, default 1)"
    )
    return serve_command(p.parse_args(argv))


COMMANDS = {
    "export": _torch_side("export.cli", "export"),
    "heads": _torch_side("export.heads_cli", "heads"),
    "serve": _serve,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: headwise {{{','.join(COMMANDS)}}} [options]", file=sys.stderr)  # noqa: T201
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
