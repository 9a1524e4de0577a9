"""The client libraries people run (current PyPI releases), unmodified, against a real server:
each gets the vectors /encode gives (cosine >= 0.9999)."""

from __future__ import annotations

import hashlib
import shutil
from importlib import resources

import httpx
import numpy as np
import pytest

from service.api.openai.tokens import CL100K_SHA256
from service.tensors import cosines
from tests.conftest import REAL_TEXTS
from tests.live import serve

pytestmark = pytest.mark.slow
TEXTS = REAL_TEXTS[:4]
CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


@pytest.fixture(scope="module")
def live(default_bundle, tmp_path_factory):
    with serve(default_bundle, tmp_path_factory.mktemp("clients")) as server:
        yield server


@pytest.fixture(scope="module")
def reference(live) -> np.ndarray:
    r = httpx.post(f"{live.url}/encode", json={"inputs": TEXTS}, timeout=60)
    return np.array(r.json()["embeddings"])


@pytest.fixture(autouse=True)
def litellm_offline(monkeypatch):
    """litellm fetches a price list from the internet at import unless told not to."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture
def tiktoken_cache(tmp_path, monkeypatch):
    """tiktoken's download cache, filled as it would be online (these machines are offline)."""
    src = resources.files("tiktoken_ext").joinpath("data/cl100k_base.tiktoken")
    name = hashlib.sha1(CL100K_URL.encode()).hexdigest()
    shutil.copy(str(src), tmp_path / name)
    assert hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() == CL100K_SHA256
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))


def test_langchain_openai_embeddings_with_its_defaults_sends_token_ids_and_works(
    live, reference, tiktoken_cache
):
    from langchain_openai import OpenAIEmbeddings

    seen = []

    def record(request: httpx.Request) -> None:
        seen.append(request.content)

    client = httpx.Client(event_hooks={"request": [record]})
    emb = OpenAIEmbeddings(
        model="all-MiniLM-L6-v2", base_url=f"{live.url}/v1", api_key="unused", http_client=client
    )
    got = np.array(emb.embed_documents(TEXTS))
    assert b'"input":[[' in seen[0], "LangChain's default sends cl100k_base token ids"
    assert cosines(got, reference).min() >= 0.9999
    one = np.array(emb.embed_query(TEXTS[1]))
    assert cosines(one[None], reference[1:2]).min() >= 0.9999


def test_huggingface_hub_inference_client_against_the_base_url(live, reference):
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=live.url)
    got = np.stack([np.asarray(client.feature_extraction(t)).reshape(-1) for t in TEXTS])
    assert cosines(got, reference).min() >= 0.9999


def test_litellm_huggingface_provider_speaks_teis_api(live, reference):
    """litellm posts {"inputs": [...]} to api_base, as to TEI. Given no input_type it first asks
    the Hub for the model's pipeline tag (offline here), and a model id containing
    "sentence-transformers" makes it send a similarity request instead: both as with TEI."""
    import litellm

    res = litellm.embedding(
        model="huggingface/all-MiniLM-L6-v2",
        api_base=live.url,
        api_key="unused",
        input=TEXTS,
        input_type="feature-extraction",
    )
    got = np.array([d["embedding"] for d in res.data])
    assert cosines(got, reference).min() >= 0.9999


def test_litellm_openai_provider(live, reference):
    import litellm

    res = litellm.embedding(
        model="openai/all-MiniLM-L6-v2", api_base=f"{live.url}/v1", api_key="unused", input=TEXTS
    )
    got = np.array([d["embedding"] for d in res.data])
    assert cosines(got, reference).min() >= 0.9999


def test_openai_sdk_retrieves_a_model_by_an_id_with_a_slash(live):
    from openai import OpenAI

    client = OpenAI(base_url=f"{live.url}/v1", api_key="unused")
    model = client.models.retrieve("sentence-transformers/all-MiniLM-L6-v2")
    assert model.id == "sentence-transformers/all-MiniLM-L6-v2" and model.created > 0
