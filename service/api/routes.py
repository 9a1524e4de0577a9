"""THE declaration: every route headwise serves, once.

FastAPI's routes and the OpenAPI document, the hot lane, the open paths, the metrics' endpoint
labels, each path's error dialect and "which routes does this model serve" are all derived from
this list (`service/api/declaration.py`). Adding a route is one entry here plus its handler in
its dialect's package. `tests/service/api/test_routes.py` checks that the app serves exactly
what is declared, and that no other file of the service names a path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.api import cohere, infinity, mixedbread, native, oip, openai, ops, tei, voyage
from service.api.cohere import handlers as cohere_handlers
from service.api.cohere import schemas as cohere_schemas
from service.api.declaration import Route, RouteTable, Variant, merged
from service.api.infinity import handlers as infinity_handlers
from service.api.infinity import schemas as infinity_schemas
from service.api.mixedbread import handlers as mixedbread_handlers
from service.api.mixedbread import schemas as mixedbread_schemas
from service.api.native import handlers as native_handlers
from service.api.native import schemas as native_schemas
from service.api.oip import handlers as oip_handlers
from service.api.oip import schemas as oip_schemas
from service.api.openai import handlers as openai_handlers
from service.api.openai import schemas as openai_schemas
from service.api.tei import handlers as tei_handlers
from service.api.tei import schemas as tei_schemas
from service.api.tei.info import Info
from service.api.voyage import handlers as voyage_handlers
from service.api.voyage import schemas as voyage_schemas

HEADWISE, OPENAI, TEI, COHERE = native.DIALECT, openai.DIALECT, tei.DIALECT, cohere.DIALECT
INFINITY, MIXEDBREAD, OIP = infinity.DIALECT, mixedbread.DIALECT, oip.DIALECT
# Paths two vendors share: errors carry both vendors' fields.
COHERE_VOYAGE = merged("cohere", COHERE.tag, COHERE, voyage.DIALECT)
OPENAI_VOYAGE = merged("openai", OPENAI.tag, OPENAI, voyage.DIALECT)


def one(request: object, handler: object, response: object) -> tuple[Variant, ...]:
    return (Variant(request, handler, response),)  # type: ignore[arg-type]


def second_if(*keys: str) -> Callable[[Any], int]:
    """Picks the second variant when the raw body has any of these fields."""
    return lambda body: int(any(k in body for k in keys))


def openai_voyage_or_chat(body: Any) -> int:
    """/v1/embeddings: OpenAI's (0), Voyage's (1), or vLLM's chat form with `messages` (2)."""
    return 2 if openai_schemas.CHAT_KEY in body else voyage_schemas.is_voyage_embed(body)


def oip_ready(path: str) -> Route:
    return Route(
        path,
        OIP,
        one(None, oip_handlers.model_ready, oip_schemas.ModelReady),
        method="GET",
        ready=False,
        errors=(404, 503),
        summary="A model's readiness: 200 once loaded and warm, 503 before",
    )


def oip_infer(path: str) -> Route:
    return Route(
        path,
        OIP,
        one(None, oip_handlers.infer, oip_schemas.InferResponse),
        ready=True,
        summary="Inference on tensors: JSON, or Triton's binary tensor extension "
        "(Inference-Header-Content-Length), both ways",
    )


def oip_metadata(path: str) -> Route:
    return Route(
        path,
        OIP,
        one(None, oip_handlers.model_metadata, oip_schemas.ModelMetadata),
        method="GET",
        errors=(404,),
        summary="A model's metadata: its inputs and outputs, named and typed by task",
    )


REHEARSAL_TEXT = "Which heads matter?"  # what a model answers before ready

ROUTES: tuple[Route, ...] = (
    # --- headwise's own ---------------------------------------------------------------------
    Route(
        "/encode",
        HEADWISE,
        one(native_schemas.EncodeRequest, native_handlers.encode, native_schemas.EncodeResponse),
        capability="encode",
        lane=True,
        rehearsal={"inputs": [REHEARSAL_TEXT]},
        summary="Embed one text or a list of texts: dense, sparse and token vectors (outputs)",
    ),
    Route(
        "/tokenize/details",
        HEADWISE,
        one(
            native_schemas.TokenizeDetailsRequest,
            native_handlers.tokenize_details,
            native_schemas.TokenizeDetailsResponse,
        ),
        capability="tokenize",
        summary="headwise's tokenisation: tokens, ids, offsets, special flags, truncation, model",
    ),
    Route(
        "/attention",
        HEADWISE,
        one(
            native_schemas.AttentionRequest,
            native_handlers.attention,
            native_schemas.AttentionResponse,
        ),
        capability="attention",
        feature="attention",
        summary="Attention maps, head statistics and token importance (JSON, or a PNG grid)",
        media_type="image/png",
    ),
    Route(
        "/explain",
        HEADWISE,
        one(native_schemas.ExplainRequest, native_handlers.explain, native_schemas.ExplainResponse),
        capability="explain",
        summary="Which words drove an embedding, a similarity or a score: occlusion importance "
        "beside attention rollout, per token or word",
    ),
    Route(
        "/attention/view",
        HEADWISE,
        one(None, native_handlers.attention_view, None),
        method="GET",
        open=True,
        feature="attention",
        summary="A page to look at the maps",
        media_type="text/html",
    ),
    # --- operations -------------------------------------------------------------------------
    Route(
        "/health",
        HEADWISE,
        one(None, ops.health, ops.Status),
        method="GET",
        open=True,
        summary="Liveness: the process answers",
    ),
    Route(
        "/ready",
        HEADWISE,
        one(None, ops.ready, ops.Status),
        method="GET",
        open=True,
        summary="Readiness: 200 once every model is loaded and warm, 503 while loading or draining",
        errors=(503,),
    ),
    # The Open Inference Protocol's (Triton's, KServe's) health paths, in its bodies.
    Route(
        "/v2/health/live",
        OIP,
        one(None, oip_handlers.server_live, oip_schemas.ServerLive),
        method="GET",
        open=True,
        documented=False,
    ),
    Route(
        "/v2/health/ready",
        OIP,
        one(None, oip_handlers.server_ready, oip_schemas.ServerReady),
        method="GET",
        open=True,
        documented=False,
        errors=(503,),
    ),
    # --- the Open Inference Protocol v2 (KServe v2, Triton): every model by its name ---------
    Route(
        "/v2",
        OIP,
        one(None, oip_handlers.server_metadata, oip_schemas.ServerMetadata),
        method="GET",
        summary="Server metadata: name, version, extensions (binary_tensor_data)",
    ),
    # Versioned paths first: a model's name may hold slashes, and {name:path} takes them.
    oip_ready("/v2/models/{name:path}/versions/{version}/ready"),
    oip_infer("/v2/models/{name:path}/versions/{version}/infer"),
    oip_metadata("/v2/models/{name:path}/versions/{version}"),
    oip_ready("/v2/models/{name:path}/ready"),
    oip_infer("/v2/models/{name:path}/infer"),
    oip_metadata("/v2/models/{name:path}"),
    Route(
        "/metrics",
        HEADWISE,
        one(None, ops.metrics, None),
        method="GET",
        open=True,
        summary="Prometheus metrics (text format)",
        media_type="text/plain",
    ),
    Route(
        "/info",
        HEADWISE,
        one(None, ops.info, ops.InfoResponse),
        method="GET",
        summary="The models, where they run, the limits; TEI's Info for ?model= or ?route=",
    ),
    # --- OpenAI -----------------------------------------------------------------------------
    Route(
        "/v1/embeddings",
        OPENAI_VOYAGE,
        (
            Variant(
                openai_schemas.EmbeddingsRequest,
                openai_handlers.embeddings,
                openai_schemas.EmbeddingsResponse,
            ),
            Variant(
                voyage_schemas.EmbeddingsRequest,
                voyage_handlers.embeddings,
                voyage_schemas.EmbeddingsResponse,
            ),
            Variant(
                openai_schemas.ChatEmbeddingsRequest,
                openai_handlers.chat_embeddings,
                openai_schemas.EmbeddingsResponse,
            ),
        ),
        capability="embed",
        lane=True,
        discriminator=openai_voyage_or_chat,
        summary="OpenAI-compatible embeddings (and Voyage's, told apart by its fields); vLLM's "
        "`messages` form: a text, or an image-text model's image",
    ),
    Route(
        "/v1/models",
        OPENAI,
        one(None, openai_handlers.models, openai_schemas.ModelList),
        method="GET",
        summary="OpenAI-compatible model list",
    ),
    Route(
        "/v1/models/{model_id:path}",
        OPENAI,
        one(None, openai_handlers.model, openai_schemas.ModelCard),
        method="GET",
        summary="One model (OpenAI); ids may contain '/'",
        errors=(404,),
    ),
    # --- TEI --------------------------------------------------------------------------------
    Route(
        "/embed",
        TEI,
        one(tei_schemas.EmbedRequest, tei_handlers.embed, tei_schemas.EmbedResponse),
        capability="embed",
        lane=True,
        summary="TEI: embed text(s) -> [[float]]",
    ),
    Route(
        "/",
        TEI,
        one(
            tei_schemas.EmbedRequest | tei_schemas.RerankRequest | tei_schemas.PredictRequest,
            tei_handlers.root,
            tei_schemas.EmbedResponse | tei_schemas.RerankResponse | tei_schemas.PredictResponse,
        ),
        ready=True,
        summary="TEI: the first model's own route (embed, rerank or predict), with its body",
    ),
    Route(
        "/embed_all",
        TEI,
        one(tei_schemas.EmbedAllRequest, tei_handlers.embed_all, tei_schemas.EmbedAllResponse),
        capability="embed",
        lane=True,
        summary="TEI: token embeddings, unpooled -> [[[float]]]",
    ),
    Route(
        "/similarity",
        TEI,
        one(tei_schemas.SimilarityRequest, tei_handlers.similarity, tei_schemas.SimilarityResponse),
        capability="embed",
        lane=True,
        summary="TEI: cosine of a source sentence to each sentence",
    ),
    Route(
        "/embed_sparse",
        TEI,
        one(
            tei_schemas.EmbedSparseRequest,
            tei_handlers.embed_sparse,
            tei_schemas.EmbedSparseResponse,
        ),
        capability="sparse",
        lane=True,
        summary="TEI: sparse embeddings -> [[{index, value}]] (SPLADE, bge-m3's lexical weights)",
    ),
    Route(
        "/tokenize",
        TEI,
        one(tei_schemas.TokenizeRequest, tei_handlers.tokenize, tei_schemas.TokenizeResponse),
        capability="tokenize",
        summary="TEI: tokens with ids, text and character spans",
    ),
    Route(
        "/decode",
        TEI,
        one(tei_schemas.DecodeRequest, tei_handlers.decode, tei_schemas.DecodeResponse),
        capability="tokenize",
        summary="TEI: token ids -> text",
    ),
    Route(
        "/rerank",
        TEI,
        (
            Variant(tei_schemas.RerankRequest, tei_handlers.rerank, tei_schemas.RerankResponse),
            Variant(
                infinity_schemas.RerankRequest,
                infinity_handlers.rerank,
                infinity_schemas.RerankResponse,
            ),
        ),
        capability="rerank",
        lane=True,
        rehearsal={"query": REHEARSAL_TEXT, "texts": [REHEARSAL_TEXT]},
        discriminator=second_if(infinity_schemas.RERANK_KEY),
        summary="TEI: score each text against the query, best first (Infinity's with `documents`)",
    ),
    Route(
        "/predict",
        TEI,
        (
            Variant(tei_schemas.PredictRequest, tei_handlers.predict, tei_schemas.PredictResponse),
            Variant(
                native_schemas.ZeroShotRequest,
                native_handlers.zero_shot,
                tei_schemas.PredictResponse,
                HEADWISE,
            ),
        ),
        capability="classify",
        lane=True,
        rehearsal={"inputs": REHEARSAL_TEXT},
        discriminator=second_if("image"),
        summary="TEI: every label's score for each text or pair; or, with `image` and `labels`, "
        "an image-text model's zero-shot probabilities",
    ),
    # --- Cohere (and Jina, and Voyage's rerank) ---------------------------------------------
    Route(
        "/v1/rerank",
        COHERE_VOYAGE,
        (
            Variant(
                cohere_schemas.RerankV1Request,
                cohere_handlers.rerank_v1,
                cohere_schemas.RerankV1Response,
            ),
            Variant(voyage_schemas.RerankRequest, voyage_handlers.rerank, voyage_schemas.RerankResponse),
        ),
        capability="rerank",
        lane=True,
        discriminator=second_if(*voyage_schemas.RERANK_KEYS),
        summary="Cohere (v1) and Jina rerank; Voyage's, told apart by its fields",
    ),
    Route(
        "/v2/rerank",
        COHERE,
        one(
            cohere_schemas.RerankV2Request,
            cohere_handlers.rerank_v2,
            cohere_schemas.RerankV2Response,
        ),
        capability="rerank",
        lane=True,
        summary="Cohere rerank (v2)",
    ),
)

ROUTES += (
    Route(
        "/v1/embed",
        COHERE,
        one(
            cohere_schemas.EmbedV1Request,
            cohere_handlers.embed_v1,
            cohere_schemas.EmbedFloatsResponse | cohere_schemas.EmbedByTypeResponse,
        ),
        capability="embed",
        lane=True,
        summary="Cohere embed (v1): floats, or by type (int8, uint8, binary, ubinary, base64)",
    ),
    Route(
        "/v2/embed",
        COHERE,
        one(
            cohere_schemas.EmbedV2Request,
            cohere_handlers.embed_v2,
            cohere_schemas.EmbedByTypeResponse,
        ),
        capability="embed",
        lane=True,
        summary="Cohere embed (v2): by type, output_dimension, max_tokens; `images` and "
        "`inputs` on an image-text model",
    ),
    # --- Voyage -----------------------------------------------------------------------------
    Route(
        "/v1/multimodalembeddings",
        voyage.DIALECT,
        one(
            voyage_schemas.MultimodalRequest,
            voyage_handlers.multimodal_embeddings,
            voyage_schemas.MultimodalResponse,
        ),
        capability="images",
        lane=True,
        summary="Voyage multimodal embed on an image-text model: each input one text or one image",
    ),
    # --- Infinity ---------------------------------------------------------------------------
    Route(
        "/embeddings",
        INFINITY,
        one(
            infinity_schemas.EmbeddingsRequest,
            infinity_handlers.embeddings,
            infinity_schemas.EmbeddingsResponse,
        ),
        capability="embed",
        lane=True,
        summary="Infinity: embeddings (OpenAI's shape without /v1); `modality: image` on an "
        "image-text model",
    ),
    Route(
        "/models",
        INFINITY,
        one(None, infinity_handlers.models, infinity_schemas.ModelList),
        method="GET",
        summary="Infinity: the model list, with queue stats and capabilities",
    ),
    # --- Mixedbread -------------------------------------------------------------------------
    Route(
        "/v1/reranking",
        MIXEDBREAD,
        one(
            mixedbread_schemas.RerankRequest,
            mixedbread_handlers.rerank,
            mixedbread_schemas.RerankResponse,
        ),
        capability="rerank",
        lane=True,
        summary="Mixedbread rerank: input strings or objects (rank_fields), top_k",
    ),
)

TABLE = RouteTable(ROUTES, default=HEADWISE)
__all__ = ["ROUTES", "TABLE", "Info"]
