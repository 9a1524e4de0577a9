"""POST /attention: per-layer, per-head attention maps of one text; GET /attention/view."""

from __future__ import annotations

import asyncio
import time
from importlib import resources

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import HTMLResponse, Response

from service import attention as analysis
from service.batcher import BatchPolicy, DynamicBatcher
from service.embedder import ClientGone, Timings, postprocess, wait_all
from service.errors import InvalidInput, PayloadTooLarge, Unavailable
from service.heatmap import encode_png, grid_image
from service.metrics import Metrics
from service.routes.common import CLIENT_CLOSED, disconnect_watch, respond, state
from service.runtime import Backend
from service.schemas import AttentionRequest
from service.settings import Settings

router = APIRouter(tags=["attention"])


def attention_batcher(
    backend: Backend, settings: Settings, metrics: Metrics, pad_id: int
) -> DynamicBatcher:
    """Its own small queue and thread, so that debugging never starves /encode."""

    def infer(ids: np.ndarray, mask: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        emb, attn = backend.attend(ids, mask)  # (B, d), (L, B, h, N, N)
        return [(emb[i], attn[:, i]) for i in range(len(ids))]

    policy = BatchPolicy(
        max_batch_tokens=settings.attention_max_tokens * 4,
        max_batch_size=4,
        max_wait_s=0.0,
        max_padding_ratio=1.0,
        max_queue=settings.attention_queue,
    )
    return DynamicBatcher(infer, policy, metrics.observer("attention"), "attention", pad_id)


def _select(name: str, chosen: list[int] | None, count: int) -> list[int]:
    if chosen is None:
        return list(range(count))
    if not chosen:
        raise InvalidInput(f"{name} must not be empty (null selects all)", param=name)
    bad = [i for i in chosen if not 0 <= i < count]
    if bad:
        raise InvalidInput(f"{name} {bad} out of range: valid are 0..{count - 1}", param=name)
    return list(dict.fromkeys(chosen))


def _index_of(ids: list[int], token_id: int | None, last: bool = False) -> int | None:
    if token_id is None or token_id not in ids:
        return None
    return len(ids) - 1 - ids[::-1].index(token_id) if last else ids.index(token_id)


@router.post("/attention", summary="Attention maps, head statistics and token importance")
async def attention(body: AttentionRequest, request: Request) -> Response:
    app = state(request)
    if not app.ready:
        raise Unavailable("model is loading", retry_after=2)
    s: Settings = app.settings
    bundle = app.bundle
    layers = _select("layers", body.layers, bundle.manifest.num_layers)
    heads = _select("heads", body.heads, bundle.manifest.num_heads)
    if len(body.input) > s.max_input_chars:
        raise PayloadTooLarge(
            f"input has {len(body.input)} characters; the limit is {s.max_input_chars}"
        )
    limit = min(s.attention_max_tokens, bundle.manifest.max_length)
    timings = Timings()
    loop = asyncio.get_running_loop()
    t0 = time.monotonic()
    enc = await loop.run_in_executor(None, app.backend.tokenize, [body.input])
    enc = enc[0]
    timings.tokenization_s = time.monotonic() - t0
    ids = enc.ids
    truncated = bool(enc.overflowing) or len(ids) > limit
    if truncated and not body.truncate:
        raise PayloadTooLarge(
            f"input has more than {limit} tokens, the limit for /attention "
            "(send truncate: true to look at the first ones)",
            param="truncate",
        )
    if len(ids) > limit:  # keep the closing [SEP] so the maps look like the model's input
        ids = ids[: limit - 1] + ids[-1:]
        n_keep = limit - 1
    else:
        n_keep = len(ids)
    n = len(ids)
    numbers = len(layers) * len(heads) * n * n
    if numbers > s.attention_max_numbers:
        raise PayloadTooLarge(
            f"{len(layers)} layers x {len(heads)} heads x {n}² tokens = {numbers} numbers; the limit "
            f"is {s.attention_max_numbers}: select fewer layers or heads, or a shorter input"
        )
    items = app.attention_batcher.submit([ids], s.request_timeout_s)
    async with disconnect_watch(request) as gone:
        try:
            ((emb, maps),) = await wait_all([it.future for it in items], s.request_timeout_s, gone)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)
    timings.queue_s, timings.inference_s = items[0].queue_s, items[0].inference_s
    maps = maps[:, :, :n, :n]  # (L, h, n, n): drop padding rows/cols of a shared batch
    selected = maps[np.ix_(layers, heads)]
    if body.format == "png":
        request.state.timing_headers = timings.headers()
        return Response(encode_png(grid_image(selected)), media_type="image/png")

    special = bundle.manifest.special_tokens
    cls_index = _index_of(ids, special.cls)
    sep_index = _index_of(ids, special.sep, last=True)
    stats = analysis.head_stats(selected, cls_index, sep_index)
    stats_rows = [
        {"layer": layer, "head": head, **{k: float(v[li, hi]) for k, v in stats.items()}}
        for li, layer in enumerate(layers)
        for hi, head in enumerate(heads)
    ]
    anchor = cls_index if cls_index is not None else 0
    offsets = [list(o) for o in enc.offsets[:n_keep]] + (
        [list(enc.offsets[-1])] if n_keep < n else []
    )
    tokens = enc.tokens[:n_keep] + (enc.tokens[-1:] if n_keep < n else [])
    payload = {
        "model": bundle.manifest.name,
        "tokens": tokens,
        "token_ids": ids,
        "offsets": offsets,
        "truncated": truncated,
        "layers": layers,
        "heads": heads,
        "attentions": selected,
        "stats": stats_rows,
        "importance": {
            "cls_last_layer": analysis.cls_importance(maps, anchor),
            "rollout": analysis.rollout(maps, anchor),
        },
        "embedding": postprocess(emb[None, :], True, None)[0],
    }
    return respond(request, payload, timings)


@router.get("/attention/view", summary="A page to look at the maps", response_class=HTMLResponse)
async def view() -> HTMLResponse:
    page = resources.files("service").joinpath("static/attention.html").read_text(encoding="utf-8")
    return HTMLResponse(page)
