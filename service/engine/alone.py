"""Whether a run is alone on its session: set by the batcher around a batch it computes on the
event loop (nothing queued, arriving or running: `DynamicBatcher._inline`), read by a session
with several streams, which may then run it with every thread (OpenVinoSession's lone model)
rather than on one stream's share. A context variable, so that nothing passes it through the
backend's many run functions, and a run elsewhere (the batcher's threads) never sees it set."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

ALONE: ContextVar[bool] = ContextVar("alone", default=False)


@contextlib.contextmanager
def alone() -> Iterator[None]:
    token = ALONE.set(True)
    try:
        yield
    finally:
        ALONE.reset(token)
