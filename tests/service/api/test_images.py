"""Images over HTTP on random-weight CLIP and SigLIP bundles: /encode's image and text vectors
and /predict's zero-shot probabilities equal transformers' (the image processor, the model's
get_image_features / get_text_features / logits) on the same pictures; bad images and refused
URLs are 4xx naming the problem; images from concurrent requests share batches."""

from __future__ import annotations

import base64
import io
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from export.cli import main
from tests.models.image_checkpoints import save_clip, save_siglip
from tests.service.conftest import client_for

TOLERANCE = 1e-4


def picture(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) % 256], -1)
    noise = rng.integers(0, 60, (h, w, 3))
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8), "RGB")


def encoded(image: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, quality=95) if fmt == "JPEG" else image.save(buf, fmt)
    return buf.getvalue()


def data_uri(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


PICTURES = [picture(64, 48, 0), picture(40, 90, 1), picture(33, 33, 2)]


@pytest.fixture(scope="module")
def towers(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("images")
    out = {}
    for kind, save in (("clip", save_clip), ("siglip", save_siglip)):
        model = save(tmp / kind)
        assert main(["--model", str(tmp / kind), "--out", str(tmp / f"{kind}-bundle")]) == 0
        out[kind] = (model, tmp / kind, tmp / f"{kind}-bundle")
    return out


@pytest.fixture(scope="module")
def client(towers):
    specs = [f"{kind}={bundle}" for kind, (_, _, bundle) in towers.items()]
    with client_for(specs) as c:
        yield c


def processor(folder: Path):
    from transformers import AutoConfig, CLIPImageProcessorPil, SiglipImageProcessorPil

    kind = AutoConfig.from_pretrained(folder).model_type
    cls = CLIPImageProcessorPil if kind == "clip" else SiglipImageProcessorPil
    return cls.from_pretrained(folder)


def their_images(towers, kind: str, images: list[Image.Image]) -> np.ndarray:
    model, folder, _ = towers[kind]
    pixels = processor(folder)(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return model.get_image_features(pixel_values=pixels).pooler_output.numpy()


def their_texts(towers, kind: str, texts: list[str]) -> np.ndarray:
    """transformers on the ids the model's own tokenizer gives (SigLIP: padded to the full
    length, no attention mask, as its model card)."""
    from tokenizers import Tokenizer

    model, folder, _ = towers[kind]
    if kind == "clip":
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        rows = [tok.encode(t).ids for t in texts]
        n = max(map(len, rows))
        ids = torch.tensor([r + [0] * (n - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (n - len(r)) for r in rows])
        feed = {"input_ids": ids, "attention_mask": mask}
    else:
        from transformers import SiglipTokenizer

        tok = SiglipTokenizer.from_pretrained(str(folder))
        feed = {"input_ids": tok(texts, padding="max_length", max_length=16, return_tensors="pt").input_ids}
    with torch.no_grad():
        return model.get_text_features(**feed).pooler_output.numpy()


def close(got: list[list[float]], want: np.ndarray) -> None:
    got_a = np.asarray(got, dtype=np.float64)
    assert got_a.shape == want.shape
    assert np.abs(got_a - want).max() < TOLERANCE
    cos = (got_a * want).sum(1) / np.linalg.norm(got_a, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() > 1 - TOLERANCE


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_image_vectors_equal_transformers(client, towers, kind: str) -> None:
    refs = [
        data_uri(encoded(PICTURES[0])),
        base64.b64encode(encoded(PICTURES[1], "JPEG")).decode(),
        data_uri(encoded(PICTURES[2], "WEBP"), "image/webp"),
    ]
    r = client.post("/encode", json={"model": kind, "images": refs})
    assert r.status_code == 200, r.text
    decoded = [Image.open(io.BytesIO(encoded(PICTURES[0]))), Image.open(io.BytesIO(encoded(PICTURES[1], "JPEG"))), Image.open(io.BytesIO(encoded(PICTURES[2], "WEBP")))]
    close(r.json()["embeddings"], their_images(towers, kind, [i.convert("RGB") for i in decoded]))
    tokens = towers[kind][0].config.vision_config
    assert r.json()["tokens"] == [16 + (kind == "clip")] * 3  # patches (and the class token)
    assert tokens.image_size == 32


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_texts_and_images_in_one_request(client, towers, kind: str) -> None:
    texts = ["w5 w9 w3", "w7"] if kind == "clip" else ["a photo of two dogs", "a red car"]
    r = client.post(
        "/encode",
        json={"model": kind, "inputs": texts, "images": [data_uri(encoded(PICTURES[0]))], "normalize": True},
    )
    assert r.status_code == 200, r.text
    got = r.json()["embeddings"]
    assert len(got) == 3
    want_t = their_texts(towers, kind, texts)
    want_i = their_images(towers, kind, [PICTURES[0]])
    want = np.concatenate([want_t, want_i])
    close(got, want / np.linalg.norm(want, axis=1, keepdims=True))
    if kind == "siglip":  # padded to the full length: every text runs 16 tokens
        assert r.json()["tokens"][:2] == [16, 16]


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_zero_shot_equals_transformers(client, towers, kind: str) -> None:
    model, folder, _ = towers[kind]
    labels = ["w5", "w7 w8", "w9"] if kind == "clip" else ["dog", "red car", "blue sky"]
    template = "w3 {label}" if kind == "clip" else "a photo of {label}"
    r = client.post(
        "/predict",
        json={"model": kind, "image": data_uri(encoded(PICTURES[1])), "labels": labels, "template": template},
    )
    assert r.status_code == 200, r.text
    got = {a["label"]: a["score"] for a in r.json()}
    scores = [a["score"] for a in r.json()]
    assert scores == sorted(scores, reverse=True)
    image = their_images(towers, kind, [PICTURES[1]])
    text = their_texts(towers, kind, [template.format(label=lab) for lab in labels])
    image, text = (x / np.linalg.norm(x, axis=1, keepdims=True) for x in (image, text))
    logits = torch.from_numpy(image @ text.T) * model.logit_scale.exp().item()
    if kind == "clip":
        want = logits.softmax(-1)[0]
    else:
        want = torch.sigmoid(logits + model.logit_bias.item())[0]
    for label, w in zip(labels, want.tolist(), strict=True):
        assert got[label] == pytest.approx(w, abs=TOLERANCE)


def bomb() -> bytes:
    """A PNG header declaring 20,000 x 20,000 pixels (no pixel data needed to refuse it)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 20_000, 20_000, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    "data, status, words",
    [
        (encoded(PICTURES[0])[:60], 422, "truncated"),
        (b"hello, not an image at all", 422, "not an image"),
        (bomb(), 413, "20000"),
    ],
)
def test_bad_images_are_4xx_naming_the_problem(client, data: bytes, status: int, words: str) -> None:
    r = client.post("/encode", json={"model": "clip", "images": [data_uri(encoded(PICTURES[2])), data_uri(data)]})
    assert r.status_code == status, r.text
    message = r.text.lower()
    assert "image 1" in message and words in message


def test_urls_are_off_unless_the_operator_allows_hosts(client) -> None:
    r = client.post("/encode", json={"model": "clip", "images": ["http://127.0.0.1:9/cat.png"]})
    assert r.status_code == 400
    assert "HEADWISE_IMAGE_URL_HOSTS" in r.text


def test_a_text_model_refuses_images(client) -> None:
    r = client.post("/predict", json={"model": "nope", "image": "x", "labels": ["a"]})
    assert r.status_code == 404


def batched(client, kind: str) -> tuple[float, float]:
    """The vision tower's batches so far: their count and the images they held."""
    count = total = 0.0
    for line in client.get("/metrics").text.splitlines():
        if 'path="encode_images"' in line and f'model="{kind}"' in line:
            if line.startswith("headwise_batch_size_count"):
                count = float(line.rsplit(" ", 1)[1])
            elif line.startswith("headwise_batch_size_sum"):
                total = float(line.rsplit(" ", 1)[1])
    return count, total


def test_images_of_concurrent_requests_share_batches(client) -> None:
    """Requests sent together are answered from batches holding several requests' images."""
    refs = [data_uri(encoded(p)) for p in PICTURES]
    before = batched(client, "clip")
    codes: list[int] = []

    def send() -> None:
        codes.append(client.post("/encode", json={"model": "clip", "images": refs}).status_code)

    threads = [threading.Thread(target=send) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [200] * 12
    after = batched(client, "clip")
    batches, images = after[0] - before[0], after[1] - before[1]
    assert images == 36
    assert batches < 12, f"{batches} batches for 12 requests: none shared"
