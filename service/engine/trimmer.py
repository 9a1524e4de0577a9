"""After load stops, RSS returns to its warm level: trim the heap once the batchers go idle.

ONNX Runtime's arena shrinkage (HEADWISE_MEMORY=shrink) and Python free what a batch used, but
glibc keeps freed blocks in its per-thread arenas. Once no batcher has had work for a moment,
malloc_trim hands them back (on a thread: it takes ms on a large heap). Under steady load it
never runs: the peak is bounded by the settings anyway (README: Memory).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from service.engine.memory import rss_bytes, trim

log = logging.getLogger(__name__)


class Trimmer:
    def __init__(self, activity: Callable[[], int], period_s: float = 1.0) -> None:
        self._activity = activity  # a number that changes whenever any work was done
        self.period_s = period_s
        self.trims = 0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        seen = self._activity()
        trimmed_at = seen
        while True:
            await asyncio.sleep(self.period_s)
            now = self._activity()
            if now == seen and now != trimmed_at:  # idle for a period since the last work
                before = rss_bytes()
                await loop.run_in_executor(None, trim)
                self.trims += 1
                trimmed_at = now
                log.debug("heap trimmed: RSS %d -> %d MB", before >> 20, rss_bytes() >> 20)
            seen = now
