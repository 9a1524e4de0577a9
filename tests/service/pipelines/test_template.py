"""A causal LM reranker's pairs through its template: prefix and suffix never cut, the middle cut
at its end with the tokenizer's appended tokens kept (Hugging Face truncation), the request's
instruction or the template's own; /attention's encoding has the same ids, and marks where the
document starts. On word-level tokenizers: no graph, no torch."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from service.manifest import RerankTemplate
from service.pipelines.template import PairTemplate, added_around, with_tokenizer

WORDS = ["<pad>", "<unk>", "<e>", "P", "S", "I:", "Q:", "D:", "yes", "no"]
VOCAB = {w: i for i, w in enumerate(WORDS)} | {f"w{i}": 10 + i for i in range(40)}
TEMPLATE = RerankTemplate(
    prefix="P P",
    suffix="S",
    format="I: {instruction} Q: {query} D: {document}",
    instruction="w1",
    yes="yes",
    no="no",
    yes_id=VOCAB["yes"],
    no_id=VOCAB["no"],
)
MAX_LENGTH = 14  # prefix 2 + suffix 1: 11 for the middle


def tokenizer(appends_end: bool) -> Tokenizer:
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if appends_end:  # Qwen3-Embedding's post-processor: every text ends with <e>
        tok.add_special_tokens(["<e>"])
        tok.post_processor = processors.TemplateProcessing(
            single="$A <e>", pair="$A <e> $B:1 <e>:1", special_tokens=[("<e>", VOCAB["<e>"])]
        )
    tok.enable_truncation(MAX_LENGTH)
    return tok


def ids(text: str) -> list[int]:
    return [VOCAB[w] for w in text.split()]


@pytest.fixture(params=[False, True], ids=["qwen3", "appends-end"])
def template(request) -> PairTemplate:
    return PairTemplate(TEMPLATE, with_tokenizer(tokenizer(request.param)), MAX_LENGTH)


def end(template: PairTemplate) -> list[int]:
    return [VOCAB["<e>"]] * template.trailing


def test_a_pair_that_fits_is_prefix_middle_suffix(template):
    (s,) = template.sequences([("w2 w3", "w4 w5")])
    middle = ids("I: w1 Q: w2 w3 D: w4 w5") + end(template)
    assert (s.ids, s.truncated) == (ids("P P") + middle + ids("S"), False)


def test_the_request_instruction_replaces_the_default(template):
    (s,) = template.sequences([("w2", "w4")], instruction="w9 w8")
    assert s.ids[2:7] == ids("I: w9 w8 Q: w2")


def test_a_long_document_is_cut_at_its_end_keeping_the_appended_token(template):
    (s,) = template.sequences([("w2", " ".join(f"w{i}" for i in range(10, 30)))])
    assert s.truncated and len(s.ids) == MAX_LENGTH
    assert s.ids[:2] == ids("P P") and s.ids[-1:] == ids("S")
    kept = 11 - template.trailing  # the middle's budget, less what the tokenizer appends
    assert s.ids[2:-1] == ids("I: w1 Q: w2 D: w10 w11 w12 w13 w14 w15")[:kept] + end(template)


def test_a_long_query_is_cut_once_the_document_is_gone(template):
    (s,) = template.sequences([(" ".join(["w2"] * 20), "w4")])
    assert s.truncated and s.ids[2:5] == ids("I: w1 Q:") and VOCAB["w4"] not in s.ids


def test_attention_encodings_carry_the_same_ids_and_mark_the_document(template):
    pairs = [("w2 w3", "w4 w5"), ("w2", " ".join(["w6"] * 20)), ("w2", "")]
    sequences = template.sequences(pairs)
    for pair, s, e in zip(pairs, sequences, template.encodings(pairs), strict=True):
        assert e.ids == s.ids and bool(e.overflowing) == s.truncated
        first = e.sequence_ids.index(1)
        assert e.sequence_ids == [0] * first + [1] * (len(e.ids) - first)
        if pair[1]:  # the document's first word is where sequence 1 starts
            assert e.tokens[first] == pair[1].split()[0]
        else:  # an empty document: sequence 1 is the suffix alone
            assert e.tokens[first:] == ["S"]


def test_what_the_tokenizer_adds_around_a_text_is_found():
    assert added_around(with_tokenizer(tokenizer(False))) == ([], [])
    assert added_around(with_tokenizer(tokenizer(True))) == ([], [VOCAB["<e>"]])


def test_a_max_length_the_prefix_and_suffix_fill_is_refused():
    with pytest.raises(ValueError, match="no room is left"):
        PairTemplate(TEMPLATE, with_tokenizer(tokenizer(False)), 3)
