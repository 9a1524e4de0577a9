"""Random-weight CLIP and SigLIP checkpoints saved by transformers (CLIPModel, SiglipModel),
re-drawn at std 0.1 like every family's (tests/models/checkpoints.py), with their image
processors' preprocessor_config.json and a word-level tokenizer.json (parity tests feed ids).

Small towers: images of 32 px in 8-px patches (16 patches), 2 layers each, heads of 12 and 8.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from tests.models.checkpoints import reinit

VOCAB = 100
EOS = VOCAB - 1  # CLIP pools the end token's vector: the first EOS of each row
IMAGE = 32
PATCH = 8


def write_tokenizer(folder: Path, specials: dict[str, int], template: str) -> None:
    """A word-level tokenizer.json ("w2 w7 ..." -> ids) whose post-processor adds the model's
    special tokens as its own tokenizer does (CLIP: start and end; SigLIP: end)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {f"w{i}": i for i in range(VOCAB)} | specials
    vocab = {word: i for word, i in vocab.items() if i not in specials.values() or word in specials}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=next(iter(specials))))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=list(specials.items())
    )
    tok.save(str(folder / "tokenizer.json"))


SENTENCE_WORDS = (
    "a photo of the cat dog sitting on mat two dogs play in snow red car parked near old church "
    "quick brown fox jumps over lazy bird flying above sea blue sky green tree small house"
)


def write_spiece(folder: Path) -> None:
    """A SentencePiece unigram vocabulary trained on a few hundred random sentences (SigLIP's
    checkpoints ship spiece.model and no tokenizer.json): <pad> 0, </s> 1, <unk> 2."""
    import io
    import random

    import sentencepiece as spm

    rng = random.Random(0)
    sentences = [" ".join(rng.choices(SENTENCE_WORDS.split(), k=rng.randint(3, 12))) for _ in range(400)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=60,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        pad_piece="<pad>",
        eos_piece="</s>",
        unk_piece="<unk>",
        minloglevel=2,
    )
    (folder / "spiece.model").write_bytes(model.getvalue())


def _text(**extra: object) -> dict[str, object]:
    return {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 16,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": EOS,
        **extra,
    }


def _vision(**extra: object) -> dict[str, object]:
    return {
        "hidden_size": 48,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "image_size": IMAGE,
        "patch_size": PATCH,
        **extra,
    }


def save_clip(folder: Path, seed: int = 0) -> nn.Module:
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel

    cfg = CLIPConfig(text_config=_text(), vision_config=_vision(), projection_dim=24)
    model = reinit(CLIPModel._from_config(cfg, attn_implementation="eager"), seed)
    with torch.no_grad():
        model.logit_scale.fill_(2.6592)  # the checkpoints' log(1 / 0.07)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    write_tokenizer(folder, {"<unk>": 0, "<start>": 1, "<end>": EOS}, "<start> $A <end>")
    CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE}, crop_size={"height": IMAGE, "width": IMAGE}
    ).save_pretrained(folder)
    return model


def save_siglip(folder: Path, seed: int = 0) -> nn.Module:
    from transformers import SiglipConfig, SiglipImageProcessorPil, SiglipModel

    cfg = SiglipConfig(
        text_config=_text(projection_size=48, pad_token_id=1, eos_token_id=1),
        vision_config=_vision(),
    )
    model = reinit(SiglipModel._from_config(cfg, attn_implementation="eager"), seed)
    with torch.no_grad():
        model.logit_scale.fill_(2.3)  # log(10) and -10: SigLIP's initial values
        model.logit_bias.fill_(-10.0)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    write_spiece(folder)
    SiglipImageProcessorPil(size={"height": IMAGE, "width": IMAGE}).save_pretrained(folder)
    return model


def texts(lengths: list[int], seed: int = 0, pad: int = 0) -> tuple[Tensor, Tensor]:
    """Random ids ending in EOS, right-padded with `pad`: ids, mask (B, N)."""
    g = torch.Generator().manual_seed(seed)
    n = max(lengths)
    ids = torch.full((len(lengths), n), pad, dtype=torch.long)
    mask = torch.zeros(len(lengths), n, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, : length - 1] = torch.randint(3, EOS, (length - 1,), generator=g)
        ids[row, length - 1] = EOS
        mask[row, :length] = 1
    return ids, mask


def pixels(count: int, seed: int = 0) -> Tensor:
    """Normalised-looking pixel values (B, 3, IMAGE, IMAGE)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(count, 3, IMAGE, IMAGE, generator=g)
