"""KServe's own SDK clients (kserve.InferenceRESTClient with protocol v2, and
kserve.InferenceGRPCClient) against a running headwise, printed as JSON.

Run as a process of its own (tests/service/rpc/test_grpc.py does): kserve's generated protos
and tritonclient's define the same `inference.*` messages in protobuf's default pool, so the
two cannot be imported into one process.

    python -m tests.service.rpc.kserve_clients HTTP_URL GRPC_TARGET EMBEDDER RANKER CLASSIFIER
"""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

TEXTS = ["the cat sat on the mat", "a dog barked", "hello world", "the fox is quick and brown"]
QUERY = "where did the cat sit"


def texts(name: str, values: list[str], binary: bool) -> InferInput:
    tensor = InferInput(name, [len(values)], "BYTES")
    tensor.set_data_from_numpy(np.array(values, dtype=object), binary_data=binary)
    return tensor


async def main(url: str, target: str, embedder: str, ranker: str, classifier: str) -> dict:
    rest = InferenceRESTClient(RESTConfig(protocol="v2"))
    grpc = InferenceGRPCClient(target, timeout=30)
    requests = {
        "embed": InferRequest(embedder, [texts("text", TEXTS, True)]),
        "embed_json": InferRequest(embedder, [texts("text", TEXTS, False)]),
        "rerank": InferRequest(ranker, [texts("query", [QUERY], True), texts("document", TEXTS, True)]),
        "classify": InferRequest(classifier, [texts("text", TEXTS, True)]),
    }
    out: dict = {
        "rest_ready": await rest.is_server_ready(url),
        "grpc_ready": await grpc.is_server_ready(),
        "grpc_model_ready": await grpc.is_model_ready(embedder),
    }
    for key, request in requests.items():
        for transport in ("rest", "grpc"):
            if transport == "grpc" and key == "embed_json":
                continue  # one encoding on gRPC
            if transport == "rest":
                response = await rest.infer(url, request, model_name=request.model_name)
            else:
                response = await grpc.infer(request)
            (tensor,) = response.outputs
            out[f"{transport}_{key}"] = {"name": tensor.name, "data": tensor.as_numpy().tolist()}
    await grpc.close()
    await rest.close()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:6]))))
