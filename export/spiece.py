"""SigLIP's SentencePiece vocabulary (spiece.model) as a tokenizer.json the service can run
with `tokenizers` alone, encoding exactly as transformers' SiglipTokenizer does.

SiglipTokenizer first canonicalises a text (big_vision's prompt engineering): "▁" becomes a
space, one "▁" goes in front, then lower case, ASCII punctuation removed, runs of whitespace
made one space, the ends stripped. It then encodes after an <unk> token and drops that token's
pieces, so SentencePiece's dummy prefix never applies to the text itself. Then "</s>" ends it.
Here each of those steps is a normalizer, in that order, followed by SentencePiece's own
(its precompiled NFKC map, extra spaces removed, spaces escaped as "▁"), over the same unigram
vocabulary and scores. Export checks every probe text against SiglipTokenizer itself and
fails on any difference (sentencepiece is needed then, on the export side only).
"""

from __future__ import annotations

import re
import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, normalizers, processors
from tokenizers.models import Unigram

SPIECE_UNDERLINE = "▁"
PUNCTUATION = "[" + re.escape(string.punctuation) + "]"
# Texts that probe the canonicalisation's corners, besides export's probe texts.
CORNERS = [
    "",
    "A photo of a CAT.",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\nand  runs   of spaces",
    "punctuation!? (brackets) [and] {braces}, 'quotes' \"double\" - dashes_underscores",
    "an ▁underline ▁▁ inside",
    "Ünïcödé café naïve ﬁ ligature",
    "numbers 1,234.56 and 50%",
]


def _proto(path: Path):  # type: ignore[no-untyped-def]
    """The SentencePiece ModelProto, read with transformers' protobuf-4+ bindings (those that
    sentencepiece itself ships are generated for protobuf 7, which the gRPC stack cannot take)."""
    from transformers.utils import sentencepiece_model_pb2_new as model_pb2

    proto = model_pb2.ModelProto()  # type: ignore[attr-defined]
    proto.ParseFromString(path.read_bytes())
    return proto


def siglip_tokenizer(spiece: Path, lower_case: bool = True) -> Tokenizer:
    proto = _proto(spiece)
    if proto.trainer_spec.model_type != 1:
        raise ValueError(f"{spiece}: SigLIP's vocabulary is a unigram model, this one is not")
    if proto.trainer_spec.byte_fallback:
        raise ValueError(f"{spiece}: byte fallback is not supported")
    vocab = [(p.piece, p.score) for p in proto.pieces]
    tok = Tokenizer(Unigram(vocab, unk_id=proto.trainer_spec.unk_id, byte_fallback=False))
    spec = proto.normalizer_spec
    steps: list[normalizers.Normalizer] = [
        normalizers.Replace(SPIECE_UNDERLINE, " "),
        normalizers.Prepend(SPIECE_UNDERLINE),
    ]
    if lower_case:
        steps.append(normalizers.Lowercase())
    steps += [
        normalizers.Replace(Regex(PUNCTUATION), ""),
        normalizers.Replace(Regex(r"\s+"), " "),
        normalizers.Strip(),
    ]
    if spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:  # the text's start is not the input's: <unk> precedes it
        steps += [normalizers.Replace(Regex(r" +\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if spec.escape_whitespaces:
        steps.append(normalizers.Replace(" ", SPIECE_UNDERLINE))
    tok.normalizer = normalizers.Sequence(steps)
    specials = [p.piece for p in proto.pieces if p.type in (2, 3)]  # unknown, control
    tok.add_special_tokens(specials)
    eos = "</s>"
    eos_id = tok.token_to_id(eos)
    if eos_id is None:
        raise ValueError(f"{spiece} has no {eos} piece, which SigLIP ends every text with")
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, eos_id)]
    )
    tok.decoder = decoders.Sequence(
        [decoders.Replace(SPIECE_UNDERLINE, " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return tok


def write_siglip_tokenizer(folder: Path, out: Path, probes: list[str]) -> Path:
    """folder's spiece.model as out/tokenizer.json, checked against SiglipTokenizer on `probes`
    and the canonicalisation's corners; a difference fails with the text and both encodings."""
    from transformers import SiglipTokenizer

    slow = SiglipTokenizer.from_pretrained(str(folder))
    tok = siglip_tokenizer(folder / "spiece.model", lower_case=slow.do_lower_case)
    for text in [*probes, *CORNERS]:
        want = slow(text).input_ids
        got = tok.encode(text).ids
        if got != want:
            raise ValueError(
                f"the converted SigLIP tokenizer encodes {text!r} as {got}, SiglipTokenizer as "
                f"{want}: not served"
            )
    path = out / "tokenizer.json"
    tok.save(str(path))
    return path
