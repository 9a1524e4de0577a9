"""What preparing a request costs before any batch runs: measured, never assumed.

A request's texts are tokenised (on the worker threads, one a core, beside the model's) and
made into sequences (on the event loop) before the batcher sees them. On a fast model that is
most of a request's work: 128 documents of ~90 tokens take ~18 ms of CPU to tokenise and ~5 ms
on 2 cores through a 2-layer model. Admission that priced only the model admitted a flood it
could not tokenise in time, and every admitted request missed its deadline together
(bench.hostile on the tiny bundles: 0 of 559 answered).

So tokenising is priced as the batches are, in seconds of the machine: a character costs
`per_char_s` of CPU, and the workers tokenise `parallel` requests at once:
- calibrated at warm-up: the model's tokenizer timed on text made of its own vocabulary
  (best of a few runs, nothing else running, on one thread);
- refined by every request served: the CPU seconds its tokenising took on the threads that did
  it (TOKENIZERS_PARALLELISM is off in the server: a call runs on the thread that makes it).
  CPU time, not wall time, so requests tokenised side by side each measure their own cost; and
  it is what the cores really spent, which under a flood is up to twice what the same text
  takes alone (the loop, the model and the other workers contend for the caches), so the price
  follows the load. Small requests say little about a rate a character (their time is the fixed
  cost of a call), so only those of at least MIN_CHARS count.

One `PrepareCost` per model (its tokenizer), shared by its pipelines' intakes. Where the
operator states the server's rate (HEADWISE_CAPACITY_TOKENS_PER_S) nothing is measured: that
rate is the whole request's.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Sequence

from tokenizers import Encoding

from service.engine.cpu import cores

# A request's preparation refines the rate when it tokenised at least this many characters.
MIN_CHARS = 2000
# The weight of the newest measurement in the running rate.
WEIGHT = 0.2
# Calibration: this many texts of TOKENS vocabulary ids each, timed REPEATS times (best kept).
TEXTS = 64
TOKENS = 96
REPEATS = 3


@functools.cache
def workers() -> int:
    """The threads that tokenise (the loop's executor): one a core the process may use, two at
    least (one long call does not hold up every other request's)."""
    return max(2, cores().usable)


class PrepareCost:
    """CPU seconds a character of a request's texts takes to tokenise, and what that is in
    seconds of the machine."""

    def __init__(self, learns: bool = True, parallel: int = 1) -> None:
        """learns: False where nothing is measured (the operator states the server's rate,
        HEADWISE_CAPACITY_TOKENS_PER_S; a test's fake backend): tokenising is not priced.
        parallel: the cores the workers tokenise on at once."""
        self.learns = learns
        self.parallel = max(1, parallel)
        self.per_char_s: float | None = None
        self.source = "not measured"
        self.measured = 0  # served requests that refined the rate

    def seconds(self, chars: int) -> float:
        """Seconds of the machine to tokenise this many characters (the CPU's, shared by the
        cores the workers use; 0 until calibrated or measured)."""
        if self.per_char_s is None:
            return 0.0
        return chars * self.per_char_s / self.parallel

    def calibrated(self, per_char_s: float) -> None:
        self.per_char_s = per_char_s
        self.source = "calibrated"

    def observe(self, chars: int, cpu_s: float) -> None:
        """A served request's tokenising: chars in cpu_s of its threads' CPU."""
        if not self.learns or chars < MIN_CHARS or cpu_s <= 0:
            return
        rate = cpu_s / chars
        old = self.per_char_s
        self.per_char_s = rate if old is None else old + WEIGHT * (rate - old)
        self.source = "measured"
        self.measured += 1

    def describe(self) -> dict[str, object]:
        """The figures /info shows."""
        return {
            "source": self.source,
            "per_char_cpu_s": self.per_char_s,
            "parallel": self.parallel,
            "requests_measured": self.measured,
        }


def sample_texts(decode: Callable[[list[int]], str], vocab_size: int, seed: int = 0) -> list[str]:
    """TEXTS texts of TOKENS ids each, drawn from the vocabulary past its first thousand (special
    and unused tokens), decoded: text the tokenizer splits as it splits real words."""
    rng = random.Random(seed)
    low = min(1000, vocab_size // 2)
    return [decode([rng.randrange(low, vocab_size) for _ in range(TOKENS)]) for _ in range(TEXTS)]


def calibrate(tokenize: Callable[[list[str]], Sequence[Encoding]], texts: list[str]) -> float:
    """Seconds a character: the best of REPEATS timed runs of `tokenize` over the texts (on
    this thread: TOKENIZERS_PARALLELISM off, its wall time is its CPU time), each
    encoding read as the pipelines read it (its ids, whether it was cut) and let go: reading
    an encoding's overflow copies it, and freeing encodings is a third of their making."""
    chars = sum(map(len, texts))
    if chars == 0:
        raise ValueError("calibration texts are empty")
    _prepare(tokenize, texts)  # the tokenizer's threads and caches, before anything is timed
    best = float("inf")
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        _prepare(tokenize, texts)
        best = min(best, time.perf_counter() - t0)
    return best / chars


def _prepare(tokenize: Callable[[list[str]], Sequence[Encoding]], texts: list[str]) -> int:
    encodings = tokenize(texts)
    n = sum(len(e.ids) + bool(e.overflowing) for e in encodings)
    del encodings
    return n
