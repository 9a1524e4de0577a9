"""Every supported family, as `transformers` saves it, exports through the CLI with fused
attention, and its bundle reproduces transformers' embeddings and attention maps.

Each checkpoint is random-weight and tiny (2 layers, d_model 32) with a tokenizer.json of its
family's kind (WordPiece, byte-level BPE, Unigram) trained in conftest.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from tokenizers import Tokenizer

from export import verify
from export.cli import main as export_cli
from service.engine.sessions import build_session
from service.manifest import Manifest
from service.tensors import cosines

TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
}
ROBERTA_IDS = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}
# family -> (transformers config class, tokenizer kind, config values)
FAMILIES = {
    "bert": ("BertConfig", "wordpiece", {**TINY, "max_position_embeddings": 64}),
    "roberta": (
        "RobertaConfig",
        "bpe",
        {**TINY, **ROBERTA_IDS, "max_position_embeddings": 66, "type_vocab_size": 1},
    ),
    "xlm-roberta": (
        "XLMRobertaConfig",
        "unigram",
        {**TINY, **ROBERTA_IDS, "max_position_embeddings": 66, "type_vocab_size": 1},
    ),
    "distilbert": (
        "DistilBertConfig",
        "wordpiece",
        {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64, "max_position_embeddings": 64},
    ),
    "mpnet": ("MPNetConfig", "wordpiece-s", {**TINY, **ROBERTA_IDS, "max_position_embeddings": 66}),
}
TEXTS = [
    "The cat sat on a warm mat.",
    "",
    "a",
    "Le chat dort sur le canapé depuis ce matin.",
    "кошка спит на диване, пока идёт дождь",
    "القطة تنام على الأريكة",
    "बिल्ली सोफे पर सो रही है",
    "猫在沙发上睡觉。猫はソファで寝ている。",
    "I love this! 😍🔥🚀",
    "the cat sat on a warm mat while rain fell " * 20,  # truncated at 64 tokens
]


def save_checkpoint(
    folder: Path, family: str, tokenizer: Path, head: str = "Model", **extra
) -> Path:
    """A random-weight transformers checkpoint (save_pretrained) plus its tokenizer.json;
    extra: config values over the family's (sizes too)."""
    import transformers

    config_cls, _, values = FAMILIES[family]
    vocab = Tokenizer.from_file(str(tokenizer)).get_vocab_size()
    config = getattr(transformers, config_cls)(vocab_size=vocab, **(values | extra))
    model_cls = getattr(transformers, config_cls.replace("Config", head))
    torch.manual_seed(0)
    model_cls(config).eval().save_pretrained(folder, safe_serialization=True)
    (folder / "tokenizer.json").write_bytes(tokenizer.read_bytes())
    return folder


def write_st_modules(folder: Path) -> None:
    """sentence-transformers' modules.json: Transformer, Pooling (1_Pooling/), Normalize."""
    kinds = ["Transformer", "Pooling", "Normalize"]
    paths = ["", "1_Pooling", "2_Normalize"]
    modules = [
        {"idx": i, "name": str(i), "path": p, "type": f"sentence_transformers.models.{k}"}
        for i, (k, p) in enumerate(zip(kinds, paths, strict=True))
    ]
    (folder / "modules.json").write_text(json.dumps(modules))


def export(folder: Path, out: Path, *flags: str) -> Manifest:
    assert export_cli(["--model", str(folder), "--out", str(out), *flags]) == 0
    return Manifest.model_validate_json((out / "manifest.json").read_text())


def feeds(bundle: Path, manifest: Manifest, items) -> dict[str, np.ndarray]:
    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    return verify.encode(tok, items, manifest.inputs, manifest.special_tokens.pad)


def transformers_model(folder: Path, head: str = "AutoModel"):
    import transformers

    loader = getattr(transformers, head)
    return loader.from_pretrained(folder, attn_implementation="eager").eval()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_exports_fused_and_matches_transformers(family, family_tokenizers, tmp_path):
    kind = FAMILIES[family][1]
    folder = save_checkpoint(tmp_path / f"tiny-{family}", family, family_tokenizers[kind])
    bundle = tmp_path / "bundle"
    manifest = export(folder, bundle)

    assert manifest.architecture == family and manifest.task == "embed"
    assert manifest.pooling == "mean" and manifest.max_length == 64
    assert manifest.source.kind == "folder" and manifest.inputs == ["input_ids", "attention_mask"]
    ops = [n.op_type for n in onnx.load(str(bundle / "encoder.onnx")).graph.node]
    assert ops.count("Attention") == 2 and "Softmax" not in ops
    assert manifest.graphs["encoder"].fused

    x = feeds(bundle, manifest, TEXTS)
    assert x["input_ids"].shape[1] == 64  # the long text was truncated
    emb, attn = build_session(bundle / "attention.onnx").run(None, x)
    served = build_session(bundle / "encoder.onnx").run(None, x)[0]

    hf = transformers_model(folder)
    ids, mask = torch.from_numpy(x["input_ids"]), torch.from_numpy(x["attention_mask"])
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=mask, output_attentions=True)
    m = mask[:, :, None].float()
    want = ((out.last_hidden_state * m).sum(1) / m.sum(1)).numpy()  # sentence-transformers' mean
    assert cosines(served, want).min() >= 0.9999
    assert cosines(emb, want).min() >= 0.9999
    np.testing.assert_allclose(attn, torch.stack(out.attentions).numpy(), atol=1e-4)


def test_special_tokens_come_from_the_family_tokenizer(family_tokenizers, tmp_path):
    folder = save_checkpoint(tmp_path / "tiny-roberta", "roberta", family_tokenizers["bpe"])
    manifest = export(folder, tmp_path / "bundle")
    tok = Tokenizer.from_file(str(tmp_path / "bundle" / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in ("<s>", "</s>", "<pad>")}
    assert manifest.special_tokens.model_dump() == {
        "cls": ids["<s>"],
        "sep": ids["</s>"],
        "pad": ids["<pad>"],
    }


def test_sentence_transformers_modules_set_pooling_normalize_length_and_prompts(
    family_tokenizers, tmp_path
):
    folder = save_checkpoint(tmp_path / "tiny-e5", "xlm-roberta", family_tokenizers["unigram"])
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling/config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    write_st_modules(folder)
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 40}))
    prompts = {"query": "query: ", "passage": "passage: "}
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": prompts, "default_prompt_name": "query"})
    )
    manifest = export(folder, tmp_path / "bundle")
    assert (manifest.pooling, manifest.normalize, manifest.max_length) == ("cls", True, 40)
    assert manifest.prompts == prompts and manifest.default_prompt_name == "query"

    overridden = export(folder, tmp_path / "last", "--pooling", "lasttoken")
    assert overridden.pooling == "lasttoken"


def test_lasttoken_pooling_is_the_last_real_token_of_transformers_output(
    family_tokenizers, tmp_path
):
    folder = save_checkpoint(tmp_path / "tiny-bert", "bert", family_tokenizers["wordpiece"])
    bundle = tmp_path / "bundle"
    manifest = export(folder, bundle, "--pooling", "lasttoken")
    x = feeds(bundle, manifest, TEXTS[:4])
    served = build_session(bundle / "encoder.onnx").run(None, x)[0]
    with torch.no_grad():
        hidden = transformers_model(folder)(
            input_ids=torch.from_numpy(x["input_ids"]),
            attention_mask=torch.from_numpy(x["attention_mask"]),
        ).last_hidden_state
    last = x["attention_mask"].sum(1) - 1
    want = hidden[torch.arange(len(last)), torch.from_numpy(last)].numpy()
    assert cosines(served, want).min() >= 0.9999


def test_a_pipeline_module_we_do_not_reproduce_is_refused_by_name(family_tokenizers, tmp_path):
    folder = save_checkpoint(tmp_path / "tiny-weights", "bert", family_tokenizers["wordpiece"])
    (folder / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": 2,
                    "name": "2",
                    "path": "2_WordWeights",
                    "type": "sentence_transformers.models.WordWeights",
                }
            ]
        )
    )
    assert export_cli(["--model", str(folder), "--out", str(tmp_path / "b")]) == 1
    assert not (tmp_path / "b").exists()


def test_bundle_with_a_prompt_matches_sentence_transformers_own_pipeline(
    family_tokenizers, tmp_path
):
    """sentence-transformers loads the same folder: prompt prepended, truncated at its
    max_seq_length with the prompt's tokens counted, mean-pooled, normalised."""
    from sentence_transformers import SentenceTransformer

    folder = save_checkpoint(tmp_path / "tiny-st", "bert", family_tokenizers["wordpiece"])
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling/config.json").write_text(
        json.dumps({"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True})
    )
    write_st_modules(folder)
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 40}))
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "query: "}, "default_prompt_name": None})
    )
    bundle = tmp_path / "bundle"
    manifest = export(folder, bundle)

    x = feeds(bundle, manifest, [manifest.prompts["query"] + t for t in TEXTS])
    assert x["input_ids"].shape[1] == 40
    emb = build_session(bundle / "encoder.onnx").run(None, x)[0]
    emb = emb / np.linalg.norm(emb, axis=-1, keepdims=True)
    st = SentenceTransformer(str(folder), device="cpu")
    ref = st.encode(TEXTS, prompt_name="query", convert_to_numpy=True)
    assert cosines(emb, ref).min() >= 0.9999
