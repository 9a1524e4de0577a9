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


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_attention_over_patches_equals_transformers(client, towers, kind: str) -> None:
    """/attention on an image: every layer's and head's map over the patches equals
    transformers' output_attentions; SigLIP's probe map equals its pooling head's; the picture
    is what the model saw; importance comes from the pooling token."""
    model, folder, _ = towers[kind]
    r = client.post("/attention", json={"model": kind, "image": data_uri(encoded(PICTURES[0]))})
    assert r.status_code == 200, r.text
    body = r.json()
    pixels = processor(folder)(images=[PICTURES[0]], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = model.vision_model(pixel_values=pixels, output_attentions=True)
    want = torch.stack(out.attentions)[:, 0].numpy()  # (L, h, N, N)
    got = np.asarray(body["attentions"])
    assert got.shape == want.shape == (2, 4, 16 + (kind == "clip"), 16 + (kind == "clip"))
    assert np.abs(got - want).max() < TOLERANCE
    assert body["modality"] == "image" and body["grid"] == 4 and body["patch_size"] == 8
    assert body["tokens"][: 2 if kind == "clip" else 1] == (["[CLS]", "r0c0"] if kind == "clip" else ["r0c0"])
    assert len(body["importance"]["rollout"]) == got.shape[-1]
    assert sum(body["importance"]["rollout"]) == pytest.approx(1.0, abs=1e-6)
    if kind == "siglip":
        head = model.vision_model.head
        hidden = out.last_hidden_state
        with torch.no_grad():
            _, probe = head.attention(head.probe, hidden, hidden, average_attn_weights=False)
        assert np.abs(np.asarray(body["pool_attention"]) - probe[0, :, 0].numpy()).max() < TOLERANCE
        assert body["importance"]["cls_last_layer"] == pytest.approx(probe[0, :, 0].mean(0).tolist(), abs=TOLERANCE)
    else:
        assert body["pool_attention"] is None
        assert body["importance"]["cls_last_layer"] == pytest.approx(want[-1, :, 0].mean(0).tolist(), abs=TOLERANCE)
    # The picture is the model's input before normalisation: it normalises back to the pixels.
    seen = Image.open(io.BytesIO(base64.b64decode(body["picture"].split(",", 1)[1])))
    assert seen.size == (32, 32)
    p = processor(folder)
    again = (np.asarray(seen, dtype=np.float64) / 255.0 - np.asarray(p.image_mean)) / np.asarray(p.image_std)
    assert np.abs(again.transpose(2, 0, 1) - pixels[0].numpy()).max() < 1.01 / 255 / min(p.image_std)


def test_attention_png_and_selection_over_an_image(client) -> None:
    ref = data_uri(encoded(PICTURES[1]))
    r = client.post("/attention", json={"model": "clip", "image": ref, "layers": [1], "heads": [0, 3]})
    assert r.status_code == 200
    assert np.asarray(r.json()["attentions"]).shape == (1, 2, 17, 17)
    r = client.post("/attention", json={"model": "clip", "image": ref, "format": "png"})
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    r = client.post("/attention", json={"model": "clip", "image": ref, "input": "w5"})
    assert r.status_code == 422


def their_vectors(towers, kind: str, pixels: np.ndarray) -> np.ndarray:
    model = towers[kind][0]
    with torch.no_grad():
        out = model.get_image_features(pixel_values=torch.from_numpy(pixels)).pooler_output.numpy()
    return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_explain_patches_equals_a_direct_computation(client, towers, kind: str) -> None:
    """Each patch's importance is transformers' image vector with that patch set to the
    normaliser's mean (0 in the model's input), against the whole image's."""
    model, folder, _ = towers[kind]
    ref = data_uri(encoded(PICTURES[2]))
    r = client.post("/explain", json={"model": kind, "image": ref})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["granularity"] == "patch" and body["grid"] == 4
    pixels = processor(folder)(images=[PICTURES[2]], return_tensors="np")["pixel_values"]
    variants = [pixels[0]]
    for row in range(4):
        for col in range(4):
            hidden = pixels[0].copy()
            hidden[:, row * 8 : (row + 1) * 8, col * 8 : (col + 1) * 8] = 0.0
            variants.append(hidden)
    vectors = their_vectors(towers, kind, np.stack(variants))
    want = 1.0 - vectors[1:] @ vectors[0]
    got = [p["importance"] for p in body["patches"]]
    assert [(p["row"], p["col"]) for p in body["patches"]][:2] == [(0, 0), (0, 1)]
    assert np.abs(np.asarray(got) - want).max() < TOLERANCE
    assert all(p["attention"] is not None for p in body["patches"])
    assert body["spearman"] is not None
    # With a text: the similarity each patch carries.
    text = "w5 w9" if kind == "clip" else "two dogs"
    r = client.post("/explain", json={"model": kind, "image": ref, "input": text})
    assert r.status_code == 200, r.text
    t = their_texts(towers, kind, [text])[0]
    t = t / np.linalg.norm(t)
    sims = vectors @ t
    assert r.json()["score"] == pytest.approx(float(sims[0]), abs=TOLERANCE)
    got = [p["importance"] for p in r.json()["patches"]]
    assert np.abs(np.asarray(got) - (sims[0] - sims[1:])).max() < TOLERANCE


def test_explain_refuses_image_shapes_it_cannot_take(client) -> None:
    ref = data_uri(encoded(PICTURES[2]))
    r = client.post("/explain", json={"model": "clip", "image": ref, "granularity": "head"})
    assert r.status_code == 422
    r = client.post("/explain", json={"model": "clip", "input": "w5", "granularity": "patch"})
    assert r.status_code == 422
