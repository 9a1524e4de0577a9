"""Whether a run is alone on its session: set by the batcher around a batch that nothing else
of its own runs beside (its inline run on the event loop; on several streams, a batch formed
with nothing queued behind it, arriving or running, the next held until it ends; calibration's
runs), read by a session with several streams, which then runs it with every thread
(OpenVinoSession's lone compile) rather than on one stream's share. A context variable, so that
nothing passes it through the backend's many run functions, and a run elsewhere never sees it
set. Another batcher of the same session (token states, several outputs) may still run beside
a lone batch, as two batchers of one session always could."""

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
