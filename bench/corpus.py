"""A fixed corpus of real English sentences of mixed length, with no download.

The sentences come from the Python documentation that ships inside CPython itself
(pydoc_data.topics): real prose, 6-45 words, sampled with a fixed seed.
"""

from __future__ import annotations

import hashlib
import random
import re
from pathlib import Path
from typing import Any


def sentences(n: int = 512, seed: int = 0) -> list[str]:
    import pydoc_data.topics as topics

    text = re.sub(r"\s+", " ", " ".join(topics.topics.values()))
    candidates = [
        s
        for s in re.split(r"(?<=[.!?])\s+", text)
        if 6 <= len(s.split()) <= 45
        and re.match(r"^[A-Z][a-z]", s)
        and not re.search(r"[*`|=>{}\[\]]", s)
    ]
    rng = random.Random(seed)
    return rng.sample(candidates, min(n, len(candidates)))


def fingerprint(texts: list[str]) -> str:
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]


def tokenized(bundle: Path, texts: list[str]) -> tuple[Any, list[list[int]]]:
    """The bundle's manifest and `texts`' token ids, as the bundle's tokenizer cuts them."""
    from tokenizers import Tokenizer

    from service.manifest import Manifest

    manifest = Manifest.model_validate_json((bundle / "manifest.json").read_text())
    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    tok.enable_truncation(max_length=manifest.max_length)
    return manifest, [e.ids for e in tok.encode_batch(texts)]
