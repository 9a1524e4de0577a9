"""Images in the vendors' own dialects, on random-weight CLIP and SigLIP bundles: Cohere's v2
embed (`images`, `inputs`), Voyage's multimodal embed, Infinity's `modality: "image"` and vLLM's
chat `messages` on /v1/embeddings give the vectors transformers gives (image and text features,
L2-normalised) on the same pictures and texts, in the request's order; an input of several
pieces is refused saying why. The vendors' SDKs, unmodified, against a real server."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from tests.live import serve
from tests.service.api.test_images import (  # noqa: F401 - towers is a fixture
    PICTURES,
    close,
    data_uri,
    encoded,
    their_images,
    their_texts,
    towers,
)
from tests.service.conftest import client_for

KINDS = ["clip", "siglip"]
TEXTS = {"clip": ["w5 w9 w3", "w7"], "siglip": ["a photo of two dogs", "a red car"]}
PNG = [data_uri(encoded(p)) for p in PICTURES]


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def images_want(towers, kind: str, pictures=PICTURES) -> np.ndarray:  # noqa: F811
    return unit(their_images(towers, kind, list(pictures)))


def texts_want(towers, kind: str) -> np.ndarray:  # noqa: F811
    return unit(their_texts(towers, kind, TEXTS[kind]))


def floats(data: list[dict]) -> list[list[float]]:
    return [d["embedding"] for d in data]


@pytest.fixture(scope="module")
def client(towers):  # noqa: F811
    with client_for([f"{kind}={bundle}" for kind, (_, _, bundle) in towers.items()]) as c:
        yield c


@pytest.fixture(scope="module")
def live(towers, tmp_path_factory):  # noqa: F811
    specs = [f"{kind}={bundle}" for kind, (_, _, bundle) in towers.items()]
    with serve(specs, tmp_path_factory.mktemp("image-dialects")) as server:
        yield server


# --- Cohere: /v2/embed ------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_cohere_v2_images_equal_transformers(client, towers, kind: str) -> None:  # noqa: F811
    body = {"model": kind, "input_type": "image", "images": PNG[:2], "embedding_types": ["float", "base64"]}
    r = client.post("/v2/embed", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    want = images_want(towers, kind, PICTURES[:2])
    close(out["embeddings"]["float"], want)
    close([np.frombuffer(base64.b64decode(s), "<f4") for s in out["embeddings"]["base64"]], want)
    assert out["texts"] == [] and out["meta"]["billed_units"]["images"] == 2


@pytest.mark.parametrize("kind", KINDS)
def test_cohere_v2_inputs_of_texts_and_images_in_order(client, towers, kind: str) -> None:  # noqa: F811
    t = TEXTS[kind]
    inputs = [
        {"content": [{"type": "image_url", "image_url": {"url": PNG[0]}}]},
        {"content": [{"type": "text", "text": t[0]}]},
        {"content": [{"type": "text", "text": t[1]}]},
        {"content": [{"type": "image_url", "image_url": {"url": PNG[1]}}]},
    ]
    body = {"model": kind, "input_type": "search_document", "inputs": inputs, "embedding_types": ["float"]}
    r = client.post("/v2/embed", json=body)
    assert r.status_code == 200, r.text
    images, texts = images_want(towers, kind, PICTURES[:2]), texts_want(towers, kind)
    close(r.json()["embeddings"]["float"], np.stack([images[0], texts[0], texts[1], images[1]]))
    assert r.json()["texts"] == t


def test_cohere_v2_refuses_an_input_mixing_text_and_image(client) -> None:
    content = [{"type": "text", "text": "w5"}, {"type": "image_url", "image_url": {"url": PNG[0]}}]
    body = {"model": "clip", "input_type": "search_document", "inputs": [{"content": content}]}
    r = client.post("/v2/embed", json=body)
    assert r.status_code == 422, r.text
    assert "inputs[0].content has 2 pieces (text, image)" in r.json()["message"]
    assert "own tower" in r.json()["message"]


def test_cohere_v2_takes_one_of_texts_images_or_inputs(client) -> None:
    r = client.post("/v2/embed", json={"model": "clip", "input_type": "image", "texts": ["w5"], "images": PNG[:1]})
    assert r.status_code == 422 and "not texts and images together" in r.text


# --- Voyage: /v1/multimodalembeddings ----------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_voyage_multimodal_inputs_equal_transformers(client, towers, kind: str) -> None:  # noqa: F811
    inputs = [
        {"content": [{"type": "text", "text": TEXTS[kind][0]}]},
        {"content": [{"type": "image_base64", "image_base64": PNG[2]}]},
    ]
    r = client.post("/v1/multimodalembeddings", json={"model": kind, "inputs": inputs})
    assert r.status_code == 200, r.text
    out = r.json()
    want = np.stack([texts_want(towers, kind)[0], images_want(towers, kind, PICTURES[2:])[0]])
    close(floats(out["data"]), want)
    assert [d["index"] for d in out["data"]] == [0, 1] and out["object"] == "list"
    usage = out["usage"]
    assert usage["image_pixels"] == 32 * 32 and usage["video_pixels"] == 0
    assert usage["total_tokens"] == usage["text_tokens"] + 16 + (kind == "clip")


def test_voyage_multimodal_refuses_interleaved_pieces_saying_why(client) -> None:
    content = [{"type": "image_base64", "image_base64": PNG[0]}, {"type": "text", "text": "w5"}]
    r = client.post("/v1/multimodalembeddings", json={"model": "clip", "inputs": [{"content": content}]})
    assert r.status_code == 422
    assert "inputs[0].content has 2 pieces (image, text)" in r.json()["detail"]


def test_an_image_error_names_its_input(client) -> None:
    inputs = [
        {"content": [{"type": "text", "text": "w5"}]},
        {"content": [{"type": "image_base64", "image_base64": data_uri(b"not an image")}]},
    ]
    r = client.post("/v1/multimodalembeddings", json={"model": "clip", "inputs": inputs})
    assert r.status_code == 422
    assert r.json()["detail"].startswith("inputs[1]: image 0: ")


# --- Infinity: /embeddings with modality image ------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_infinity_image_modality_equals_transformers(client, towers, kind: str) -> None:  # noqa: F811
    r = client.post("/embeddings", json={"model": kind, "input": PNG, "modality": "image"})
    assert r.status_code == 200, r.text
    close(floats(r.json()["data"]), images_want(towers, kind))
    assert r.json()["usage"]["prompt_tokens"] == 3 * (16 + (kind == "clip"))


# --- OpenAI-style, as vLLM: /v1/embeddings with messages ---------------------------------


def chat(content: list[dict]) -> list[dict]:
    return [{"role": "user", "content": content}]


@pytest.mark.parametrize("kind", KINDS)
def test_vllm_messages_give_an_image_or_a_text_vector(client, towers, kind: str) -> None:  # noqa: F811
    image = chat([{"type": "image_url", "image_url": {"url": PNG[1]}}])
    r = client.post("/v1/embeddings", json={"model": kind, "messages": image, "encoding_format": "float"})
    assert r.status_code == 200, r.text
    close(floats(r.json()["data"]), images_want(towers, kind, PICTURES[1:2]))
    text = chat([{"type": "text", "text": TEXTS[kind][1]}])
    r = client.post("/v1/embeddings", json={"model": kind, "messages": text, "encoding_format": "float"})
    assert r.status_code == 200, r.text
    close(floats(r.json()["data"]), texts_want(towers, kind)[1:])


def test_vllm_messages_refuse_text_with_an_image(client) -> None:
    both = chat([{"type": "image_url", "image_url": {"url": PNG[0]}}, {"type": "text", "text": "w5"}])
    r = client.post("/v1/embeddings", json={"model": "clip", "messages": both})
    assert r.status_code == 422
    assert "text only or one image only" in r.json()["error"]["message"]


def test_text_input_on_v1_embeddings_is_as_before(client, towers) -> None:  # noqa: F811
    r = client.post("/v1/embeddings", json={"model": "clip", "input": TEXTS["clip"], "encoding_format": "float"})
    assert r.status_code == 200, r.text
    close(floats(r.json()["data"]), texts_want(towers, "clip"))


# --- The SDKs, unmodified, against a real server -----------------------------------------


@pytest.mark.slow
def test_cohere_sdk_embeds_images_and_inputs(live, towers) -> None:  # noqa: F811
    import cohere

    co = cohere.ClientV2(api_key="unused", base_url=live.url, max_retries=0)
    res = co.embed(model="siglip", input_type="image", embedding_types=["float"], images=PNG[:2])
    close(res.embeddings.float_, images_want(towers, "siglip", PICTURES[:2]))
    inputs = [
        cohere.EmbedInput(content=[cohere.TextEmbedContent(text=TEXTS["siglip"][0])]),
        cohere.EmbedInput(content=[cohere.ImageUrlEmbedContent(image_url=cohere.EmbedImageUrl(url=PNG[2]))]),
    ]
    res = co.embed(model="siglip", input_type="search_query", embedding_types=["float"], inputs=inputs)
    want = np.stack([texts_want(towers, "siglip")[0], images_want(towers, "siglip", PICTURES[2:])[0]])
    close(res.embeddings.float_, want)


@pytest.mark.slow
def test_voyage_sdk_multimodal_embed(live, towers) -> None:  # noqa: F811
    import voyageai

    vo = voyageai.Client(api_key="unused", base_url=f"{live.url}/v1", max_retries=0)
    res = vo.multimodal_embed(inputs=[[PICTURES[0]], [TEXTS["clip"][0]], [PICTURES[1]]], model="clip")
    images = images_want(towers, "clip", PICTURES[:2])
    close(res.embeddings, np.stack([images[0], texts_want(towers, "clip")[0], images[1]]))
    assert res.image_pixels == 2 * 32 * 32 and res.total_tokens == res.text_tokens + 2 * 17
    with pytest.raises(voyageai.error.MalformedRequestError, match="2 pieces"):
        vo.multimodal_embed(inputs=[[TEXTS["clip"][0], PICTURES[0]]], model="clip")


@pytest.mark.slow
def test_infinity_client_embeds_images(live, towers) -> None:  # noqa: F811
    from infinity_client import Client
    from infinity_client.api.default import embeddings
    from infinity_client.models import OpenAIEmbeddingInputImage

    c = Client(base_url=live.url, raise_on_unexpected_status=True)
    out = embeddings.sync(client=c, body=OpenAIEmbeddingInputImage(input_=PNG, model="clip"))
    close([d.embedding for d in out.data], images_want(towers, "clip"))


@pytest.mark.slow
def test_openai_sdk_posts_vllm_chat_embeddings(live, towers) -> None:  # noqa: F811
    """vLLM's documented helper: the SDK's `post` with `messages` (its types, its parsing)."""
    from openai import OpenAI
    from openai.types.create_embedding_response import CreateEmbeddingResponse

    client = OpenAI(api_key="unused", base_url=f"{live.url}/v1", max_retries=0)
    messages = chat([{"type": "image_url", "image_url": {"url": PNG[0]}}])
    res = client.post(
        "/embeddings",
        cast_to=CreateEmbeddingResponse,
        body={"messages": messages, "model": "siglip", "encoding_format": "float"},
    )
    close([d.embedding for d in res.data], images_want(towers, "siglip", PICTURES[:1]))
    r = httpx.post(
        f"{live.url}/v1/embeddings",
        json={"model": "siglip", "messages": chat([{"type": "text", "text": TEXTS["siglip"][0]}])},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    close(floats(r.json()["data"]), texts_want(towers, "siglip")[:1])
