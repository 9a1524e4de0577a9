"""What an explanation leaves out, and how two importances compare.

A part is an ordinary token of one text (special tokens are never parts) or one of the
tokenizer's own words (`Encoding.word_ids`, per sequence of a pair) with all its tokens, and
knows where it lies in its text. An occluded variant is the sequence with the part's
attention-mask entries 0: it is neither attended to nor pooled, and the others keep their
positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from tokenizers import Encoding

Granularity = Literal["token", "word", "head"]  # head: explain/heads.py, no parts


@dataclass(frozen=True)
class Part:
    text: int  # which text of the request (0, or 1: a pair's document, similarity's second)
    positions: tuple[int, ...]  # its tokens' positions in the sequence
    start: int  # [start, stop): characters of its text
    stop: int


def parts_of(
    enc: Encoding,
    sequence: int,
    source: str,
    text: int,
    granularity: Granularity,
    prompt_chars: int = 0,
) -> list[Part]:
    """The parts of one sequence of an encoding (0, or 1: a pair's second text), in order.

    source: the string that sequence was tokenised from. prompt_chars: characters of a prompt
    it begins with; a token that starts inside it is the prompt's, not a part, and offsets are
    shifted back into the text. A part's span leaves out the spaces at its ends (SentencePiece's
    words begin with the space before them).
    """
    groups: dict[object, list[int]] = {}
    offsets = enc.offsets  # a property that copies the whole list: read once
    rows = zip(enc.sequence_ids, enc.special_tokens_mask, enc.word_ids, offsets, strict=True)
    for position, (seq, special, word, (start, _)) in enumerate(rows):
        if seq != sequence or special or start < prompt_chars:
            continue
        key = position if granularity == "token" or word is None else ("word", word)
        groups.setdefault(key, []).append(position)
    parts = []
    for positions in groups.values():
        spans = [offsets[p] for p in positions]
        start, stop = min(a for a, _ in spans), max(b for _, b in spans)
        while start < stop and source[start].isspace():
            start += 1
        while stop > start and source[stop - 1].isspace():
            stop -= 1
        parts.append(Part(text, tuple(positions), start - prompt_chars, stop - prompt_chars))
    return parts


def occluded(n: int, parts: Sequence[Part]) -> list[list[int]]:
    """The attention masks of a sequence of n tokens: whole, then each part left out."""
    masks = [[1] * n]
    for part in parts:
        mask = [1] * n
        for p in part.positions:
            mask[p] = 0
        masks.append(mask)
    return masks


def ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given the mean of the ranks they span."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    out = np.empty(len(values), dtype=np.float64)
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and ordered[j + 1] == ordered[i]:
            j += 1
        out[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: Sequence[float], b: Sequence[float] | None) -> float | None:
    """Spearman's rank correlation (ties averaged); None where it is undefined: fewer than two
    values, or either side constant."""
    if b is None or len(a) < 2:
        return None
    ra, rb = ranks(np.asarray(a, dtype=np.float64)), ranks(np.asarray(b, dtype=np.float64))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = float(np.sqrt((ra * ra).sum() * (rb * rb).sum()))
    if denominator == 0:
        return None
    return float((ra * rb).sum() / denominator)
