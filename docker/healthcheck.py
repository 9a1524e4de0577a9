"""Container health check: exit 0 when GET /health answers 200, else 1.

The standard library only, so the images need no curl or wget. Docker's HEALTHCHECK and
compose's healthcheck run it; Kubernetes probes /health and /ready over HTTP instead.
"""

from __future__ import annotations

import os
import sys
import urllib.request


def main() -> int:
    port = os.environ.get("HEADWISE_PORT", "8000")
    url = f"http://127.0.0.1:{port}/health"
    try:
        with urllib.request.urlopen(url, timeout=float(os.environ.get("HEALTHCHECK_TIMEOUT", "2"))) as r:
            if r.status == 200:
                return 0
            print(f"unhealthy: {url} answered {r.status}", file=sys.stderr)
    except Exception as exc:  # refused, timed out, HTTP error: all unhealthy
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
