"""Shared fixtures: a tiny random-weight bundle (seconds) and the real default bundle."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

# Every server the suite starts (in-process, or a `headwise serve` child, which inherits it)
# times its sessions on a 1 s budget, not the default 8: hundreds of starts, and the shapes past
# it are predicted. The tests of calibration and admission give the default back explicitly
# (tests/service/test_measured_admission.py, tests/service/engine/test_cost.py).
os.environ.setdefault("HEADWISE_CALIBRATION_S", "1")
# The suite's parity tests hold ONNX Runtime's fp32 to 1e-4 of the references; on a CPU with bf16
# units the default (auto) would serve OpenVINO bf16. The tests of that choice and of OpenVINO
# ask for it explicitly (tests/service/engine/test_choice.py, tests/export/test_openvino.py).
os.environ.setdefault("HEADWISE_RUNTIME", "onnxruntime")

REAL_TEXTS = [
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "The new movie is awesome, I loved every minute of it!",
    "Le chat dort sur le canapé depuis ce matin.",
    "量子コンピュータは従来のコンピュータとは異なる原理で動作する。",
    "Can I return these shoes if they don't fit? 👟",
    "",
    "Transformers use self-attention to relate every token to every other token. " * 30,
]


def shared(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """A session fixture's folder, built once for the whole run. Under pytest-xdist (`make test`)
    each worker is a session of its own: the first to ask builds the folder under the run's
    common temporary root while the others wait on a lock, then all use it, instead of every
    worker exporting the same bundle. Without workers: a folder of this session's, as before."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        out = factory.mktemp(name)
        build(out)
        return out
    root = factory.getbasetemp().parent / "shared"
    root.mkdir(exist_ok=True)
    out, done = root / name, root / f"{name}.built"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)  # a worker's build that failed halfway
            out.mkdir()
            build(out)
            done.touch()
    return out


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from models.weights import default_model_dir

    return default_model_dir()


def tiny_loaded(model_dir: Path, seed: int = 0, **overrides):
    """A 2-layer, 4-head, d_model 32 encoder with random weights and the real tokenizer."""
    import torch

    from models.config import EncoderConfig
    from models.encoder import SentenceEncoder
    from models.weights import LoadedModel

    torch.manual_seed(seed)
    cfg = EncoderConfig(
        d_model=32,
        n_heads=4,
        n_layers=2,
        d_ff=64,
        max_positions=64,
        dropout=0.0,
        attn_dropout=0.0,
        **overrides,
    )
    model = SentenceEncoder(cfg).eval()
    return LoadedModel(
        model=model,
        config=cfg,
        name="tiny-random",
        source=Path("random"),
        max_length=48,
        normalize=True,
        tokenizer_path=model_dir / "tokenizer.json",
    )


@pytest.fixture(scope="session")
def tiny_model(model_dir: Path):
    return tiny_loaded(model_dir)


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory: pytest.TempPathFactory, tiny_model) -> Path:
    from export.bundle import ExportOptions, build_bundle

    # A random model cannot show retrieval quality: a few pairs exercise the gate, fast.
    options = ExportOptions(fp16=True, int8=True, int8_pairs=24)
    return shared(tmp_path_factory, "tiny", lambda d: build_bundle(tiny_model, d / "b", options)) / "b"


@pytest.fixture(scope="session")
def ranker_bundle(family_tokenizers, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight BertForSequenceClassification (one label) saved by transformers and
    exported by the CLI: the reranker every service test that needs a real one shares."""
    from tests.export.test_architectures import export, save_checkpoint

    def build(tmp: Path) -> None:
        folder = save_checkpoint(
            tmp / "bert-ranker", "bert", family_tokenizers["wordpiece"],
            "ForSequenceClassification", num_labels=1,
        )  # fmt: skip
        export(folder, tmp / "bundle")

    return shared(tmp_path_factory, "ranker", build) / "bundle"


@pytest.fixture(scope="session")
def m3_bundle(family_tokenizers, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight bge-m3-shaped checkpoint (XLM-R, FlagEmbedding's sparse_linear.pt and
    colbert_linear.pt) exported by the CLI: a model with dense, sparse and multi-vector outputs."""
    from tests.export.output_checkpoints import m3_checkpoint
    from tests.export.test_architectures import export

    def build(tmp: Path) -> None:
        export(m3_checkpoint(tmp / "bge-m3-tiny", family_tokenizers["unigram"]), tmp / "bundle")

    return shared(tmp_path_factory, "m3", build) / "bundle"


@pytest.fixture(scope="session")
def clip_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight CLIPModel (tests/models/image_checkpoints.py) exported by the CLI: the
    image-text model the manual's examples and the dialects' image tests share."""
    from export.cli import main
    from tests.models.image_checkpoints import save_clip

    def build(tmp: Path) -> None:
        save_clip(tmp / "clip")
        assert main(["--model", str(tmp / "clip"), "--out", str(tmp / "bundle")]) == 0

    return shared(tmp_path_factory, "clip", build) / "bundle"


# Fixtures that export a bundle with torch (seconds each): a test using any of them is marked
# `bundle`, and `make test-fast` leaves it out.
BUNDLE_FIXTURES = {
    "tiny_model", "tiny_bundle", "default_loaded", "default_bundle", "ranker_bundle", "m3_bundle",
    "clip_bundle",
}


# Modules whose tests time the machine itself (admission on measured speed, a storm's refusals,
# sockets held open against a CPU budget) or hold a fake backend's sleeps to tens of
# milliseconds: marked `serial`, and `make test` runs them alone after the rest, which it spreads
# over the CPUs (another test beside them would be their load). 2 minutes together, most of it
# the first.
SERIAL_MODULES = {
    "tests/service/test_measured_admission.py",
    "tests/service/http/test_overload.py",
    "tests/service/http/test_protocol.py",
    "tests/service/engine/test_batcher.py",
    "tests/service/engine/test_admission.py",
    "tests/service/engine/test_cost.py",
    "tests/service/engine/test_gauges.py",
    "tests/service/pipelines/test_base.py",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).resolve().parent.parent
    if missing := sorted(m for m in SERIAL_MODULES if not (root / m).is_file()):
        raise pytest.UsageError(f"SERIAL_MODULES names modules that are not there: {missing}")
    for item in items:
        path = item.path.as_posix()
        if BUNDLE_FIXTURES & set(getattr(item, "fixturenames", ())) or "/tests/export/" in path:
            item.add_marker(pytest.mark.bundle)
        if item.path.resolve().relative_to(root).as_posix() in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)


@pytest.fixture(scope="session")
def default_loaded(model_dir: Path):
    from models.weights import DEFAULT_MODEL_NAME, load_pretrained

    return load_pretrained(model_dir, name=DEFAULT_MODEL_NAME)


@pytest.fixture(scope="session")
def default_bundle(tmp_path_factory: pytest.TempPathFactory, default_loaded) -> Path:
    from export.bundle import build_bundle

    logging.getLogger("onnxruntime").setLevel(logging.WARNING)
    return shared(tmp_path_factory, "default", lambda d: build_bundle(default_loaded, d / "b")) / "b"


@pytest.fixture(scope="session")
def sentence_transformer(model_dir: Path):
    """The independent reference: sentence-transformers' own all-MiniLM-L6-v2 pipeline."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir), device="cpu")


# --- Tokenizers of each family, trained offline on a small multilingual corpus -------------

_WORDS = {
    "en": "the cat sat on a warm mat while rain fell over quiet city streets tonight",
    "fr": "le chat dort sur le canapé depuis ce matin près de la fenêtre ouverte",
    "de": "die Katze schläft auf dem Sofa während draußen der Regen fällt",
    "ru": "кошка спит на диване пока за окном идёт тихий дождь",
    "el": "η γάτα κοιμάται στον καναπέ ενώ έξω βρέχει ήσυχα",
    "ar": "القطة تنام على الأريكة بينما يهطل المطر في الخارج",
    "hi": "बिल्ली सोफे पर सो रही है जबकि बाहर बारिश हो रही है",
    "zh": "猫 在 沙发 上 睡觉 外面 正在 下雨 城市 很 安静",
    "ja": "猫 は ソファ で 寝て いる 外 は 雨 が 降って いる",
    "emoji": "I love this 😍 🔥 🚀 great café naïve résumé déjà vu 123 4567",
}


def training_corpus() -> list[str]:
    """A few hundred sentences in ten scripts: every word is rotated through every position."""
    lines = []
    for words in _WORDS.values():
        w = words.split()
        for shift in range(len(w)):
            rotated = w[shift:] + w[:shift]
            lines += [" ".join(rotated), " ".join(rotated[: len(w) // 2]).capitalize() + "."]
    return lines


def _template(cls: str, sep: str, pair_types: bool, ids: dict[str, int]):
    from tokenizers.processors import TemplateProcessing

    b = 1 if pair_types else 0
    return TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        # RoBERTa-style pairs carry a double separator; BERT-style pairs a second segment type.
        pair=f"{cls}:0 $A:0 {sep}:0 $B:{b} {sep}:{b}"
        if pair_types
        else f"{cls}:0 $A:0 {sep}:0 {sep}:0 $B:0 {sep}:0",
        special_tokens=[(cls, ids[cls]), (sep, ids[sep])],
    )


def build_tokenizer(kind: str, path: Path, vocab_size: int = 800) -> Path:
    """kind: "wordpiece" (BERT, DistilBERT), "wordpiece-s" (MPNet: <s> </s>), "bpe"
    (RoBERTa, byte-level), "unigram" (XLM-RoBERTa, SentencePiece-style) -> tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from tokenizers.processors import RobertaProcessing

    if kind == "wordpiece":
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    elif kind == "wordpiece-s":
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
    elif kind == "bpe":
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        tok = Tokenizer(models.BPE(unk_token=None))
    else:
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        tok = Tokenizer(models.Unigram())
    if kind.startswith("wordpiece"):
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials)
    elif kind == "bpe":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
    else:
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>"
        )
    tok.train_from_iterator(training_corpus(), trainer)
    ids = {s: tok.token_to_id(s) for s in specials}
    if kind == "wordpiece":
        tok.post_processor = _template("[CLS]", "[SEP]", True, ids)
    elif kind == "bpe":
        tok.post_processor = RobertaProcessing(("</s>", ids["</s>"]), ("<s>", ids["<s>"]))
    else:
        tok.post_processor = _template("<s>", "</s>", False, ids)
    tok.save(str(path))
    return path


@pytest.fixture(scope="session")
def family_tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tokenizer.json per tokenizer kind, trained once per session (under a second each)."""
    kinds = ("wordpiece", "wordpiece-s", "bpe", "unigram")

    def build(folder: Path) -> None:
        for k in kinds:
            build_tokenizer(k, folder / f"{k}.json")

    folder = shared(tmp_path_factory, "tokenizers", build)
    return {k: folder / f"{k}.json" for k in kinds}
