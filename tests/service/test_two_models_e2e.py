"""`headwise serve --bundle A --bundle B`, a real process: the default model and a differently
sized random-weight BERT (saved by transformers, exported through the CLI) side by side."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys

import httpx
import numpy as np
import pytest
import torch
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

from export import verify
from service.tensors import cosines
from tests.conftest import REAL_TEXTS
from tests.live import serve

pytestmark = pytest.mark.slow
SECOND = "random/bert-h128"


@pytest.fixture(scope="module")
def second_bundle(tmp_path_factory, model_dir):
    """A BERT with hidden size 128, random weights, saved by transformers, exported by the CLI."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(7)
    config = BertConfig(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=128,
    )
    folder = tmp_path_factory.mktemp("hf") / "bert-h128"
    BertModel(config).eval().save_pretrained(folder)
    shutil.copy(model_dir / "tokenizer.json", folder / "tokenizer.json")
    out = tmp_path_factory.mktemp("bundles") / "second"
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "export", "--model", str(folder), "--name", SECOND,
         "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return folder, out


def pytorch_reference(folder, bundle, texts):
    """transformers' BertModel on the bundle tokenizer's ids, pooled as the manifest says."""
    from transformers import BertModel

    ids, mask = verify.tokenize(Tokenizer.from_file(str(bundle / "tokenizer.json")), texts)
    model = BertModel.from_pretrained(folder).eval()
    with torch.no_grad():
        hidden = model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))[0]
    m = torch.from_numpy(mask)[:, :, None].float()
    mean = (hidden * m).sum(1) / m.sum(1)
    cls = hidden[:, 0]
    return mean.numpy(), cls.numpy()


@pytest.fixture(scope="module")
def live(default_bundle, second_bundle, tmp_path_factory):
    with serve([str(default_bundle), str(second_bundle[1])], tmp_path_factory.mktemp("two")) as s:
        yield s


def test_each_model_answers_with_its_own_vectors_under_mixed_concurrent_load(
    live, second_bundle, sentence_transformer
):
    folder, bundle = second_bundle
    texts = REAL_TEXTS[:6]
    want_default = sentence_transformer.encode(texts, convert_to_numpy=True)
    mean, cls = pytorch_reference(folder, bundle, texts)
    pooling = httpx.get(f"{live.url}/info").json()["models"][1]["pooling"]
    want_second = mean if pooling == "mean" else cls

    async def mixed():
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as c:
            jobs = [
                c.post("/encode", json={"inputs": [t], "model": name, "normalize": False})
                for _ in range(8)
                for t in texts
                for name in ("sentence-transformers/all-MiniLM-L6-v2", SECOND)
            ]
            return await asyncio.gather(*jobs)

    responses = asyncio.run(mixed())
    assert [r.status_code for r in responses] == [200] * len(responses)
    for i, r in enumerate(responses):
        body = r.json()
        text_index = (i // 2) % len(texts)
        want = want_default if i % 2 == 0 else want_second
        assert body["dimensions"] == (384 if i % 2 == 0 else 128)
        got = np.array(body["embeddings"])
        assert cosines(got, want[text_index : text_index + 1]).min() >= 0.9999, body["model"]


def test_the_openai_sdk_lists_and_retrieves_both_models(live):
    client = OpenAI(base_url=f"{live.url}/v1", api_key="unused")
    ids = [m.id for m in client.models.list().data]
    assert ids == ["sentence-transformers/all-MiniLM-L6-v2", SECOND]
    assert client.models.retrieve(SECOND).id == SECOND
    assert client.models.retrieve("sentence-transformers/all-MiniLM-L6-v2").created > 0
    res = client.embeddings.create(model=SECOND, input=["hello"])
    assert len(res.data[0].embedding) == 128


def test_metrics_show_both_models_series(live):
    for name in ("sentence-transformers/all-MiniLM-L6-v2", SECOND):
        httpx.post(f"{live.url}/encode", json={"inputs": "x", "model": name})
    text = httpx.get(f"{live.url}/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    models = {s.labels["model"] for s in families["headwise_inference_duration_seconds"].samples}
    assert models >= {"sentence-transformers/all-MiniLM-L6-v2", SECOND}
