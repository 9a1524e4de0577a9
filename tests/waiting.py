"""Waiting on state across threads or processes, where no event can be shared.

`until(check)` asks the state again and again (yielding the CPU between asks) until `check`
returns a truthy value, and fails with a message when `timeout_s` passes first. It waits for
what the test needs, never for a fixed time that "usually suffices".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(check: Callable[[], T], what: str, timeout_s: float = 20.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.005)  # a yield between asks, not a guess at how long it takes
