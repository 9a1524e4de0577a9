"""torch.onnx.export of the two graphs, with dynamic batch and sequence axes.

Both graphs take `inputs` (input_ids, attention_mask, and token_type_ids for a BERT
cross-encoder, whose pairs need them) and put the primary output first: the pooled sentence
embedding (task embed) or the logits (rerank, classify). A model with other outputs
(models/outputs.py: lexical weights, a SPLADE vector, token vectors) has them all in its
serving graph, its primary one first (the dense vector when it has one). The exporter traces
the graph without the weights, which export/stream.py then writes into `<graph>.data` beside
it a tensor at a time, in float32 whatever the checkpoint's dtype; export/optimize.py and
export/external.py re-save each graph as one file, or one graph and one data file past 2 GiB.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import Tensor, nn

from export import stream
from export.external import lean_tracing
from export.fused import ort_kernels
from models.encoder import SentenceEncoder, config_of
from models.outputs import TOKEN_VECTORS, TOKEN_WEIGHTS, MultiOutputEncoder

log = logging.getLogger(__name__)

OPSET = 17
INPUTS = ["input_ids", "attention_mask"]
TOKEN_TYPES = "token_type_ids"


def graph_inputs(model: nn.Module) -> list[str]:
    """A classifier of a family with token types takes them (pairs); everything else does not."""
    if config_of(model).token_types and not isinstance(model, SentenceEncoder | MultiOutputEncoder):
        return [*INPUTS, TOKEN_TYPES]
    return list(INPUTS)


def primary_output(model: nn.Module) -> str:
    if isinstance(model, MultiOutputEncoder):
        return model.spec.graph_outputs[0]
    return "sentence_embedding" if isinstance(model, SentenceEncoder) else "logits"


TOKENS = "token_embeddings"
# Which axes of each output are dynamic: per text, or per text and token.
PER_TOKEN = {TOKENS, TOKEN_WEIGHTS, TOKEN_VECTORS}


def output_axes(name: str) -> dict[int, str]:
    return {0: "batch", 1: "sequence"} if name in PER_TOKEN else {0: "batch"}


class ServingGraph(nn.Module):
    """ids, mask[, types] -> pooled embedding (not normalised: that is per request) or logits.

    An embedding model's graph also outputs the last layer's token vectors (TEI's /embed_all).
    The service asks for the pooled output alone on the hot path, so nothing is copied then.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
    ) -> Tensor | tuple[Tensor, ...]:
        if isinstance(self.model, MultiOutputEncoder):
            return tuple(self.model.outputs(input_ids, attention_mask, token_type_ids).values())
        if isinstance(self.model, SentenceEncoder):
            hidden = self.model.encoder(input_ids, attention_mask, token_type_ids).hidden
            return self.model.pool(hidden, attention_mask), hidden  # (B, d), (B, N, d)
        out: Tensor
        out, _ = self.model(input_ids, attention_mask, token_type_ids=token_type_ids)
        return out  # (B, num_labels)


HEAD_GATES = "head_gates"


class AttentionGraph(nn.Module):
    """ids, mask[, types], head gates (B, L, h) -> primary output and every layer's
    probabilities (L, B, h, N, N).

    The gates multiply each head's output (models/attention.py): ones give the model as it is,
    a 0 at [b, l, i] runs row b without layer l's head i (/explain's head importance)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor | None = None,
        head_gates: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        out, attentions = self.model(
            input_ids,
            attention_mask,
            token_type_ids=token_type_ids,
            need_weights=True,
            head_gates=head_gates,
        )
        return out, torch.stack(attentions)  # (B, d), (L, B, h, N, N)


def _sample_inputs(vocab_size: int, inputs: list[str]) -> tuple[Tensor, ...]:
    ids = torch.randint(1000 % vocab_size, vocab_size, (2, 9), dtype=torch.int64)
    mask = torch.ones(2, 9, dtype=torch.int64)
    mask[1, 6:] = 0
    types = torch.zeros(2, 9, dtype=torch.int64)
    types[:, 4:] = 1
    return (ids, mask, types)[: len(inputs)]


def _export(
    module: nn.Module,
    model: nn.Module,
    path: Path,
    outputs: list[str],
    dynamic: dict[str, dict[int, str]],
    gated: bool = False,
) -> None:
    """A text model's graph; gated: it takes head gates (B, L, h) after its token inputs."""
    cfg = config_of(model)
    tokens = graph_inputs(model)
    axes = {name: {0: "batch", 1: "sequence"} for name in tokens}
    sample: tuple[object, ...] = _sample_inputs(cfg.vocab_size, tokens)
    inputs = list(tokens)
    if gated:
        inputs.append(HEAD_GATES)
        axes[HEAD_GATES] = {0: "gate_rows"}
        # As a keyword: a graph without token types has no third positional input.
        sample = (*sample, {HEAD_GATES: torch.ones(2, cfg.n_layers, cfg.n_heads)})
    trace(module, path, sample, inputs, outputs, {**axes, **dynamic})


def trace(
    module: nn.Module,
    path: Path,
    sample: tuple[object, ...],
    inputs: list[str],
    outputs: list[str],
    axes: dict[str, dict[int, str]],
) -> None:
    """torch.onnx.export of `module` on `sample`, its weights written after (export/stream.py)."""
    module.eval()
    with torch.no_grad(), warnings.catch_warnings(), stream.shadow_weights(module) as state:
        # The TorchScript exporter is the one whose graph shape ONNX Runtime's BERT fusion
        # matches; it warns that it is deprecated. It traces memoryless stand-ins of the
        # weights, which stream.materialize then writes (export/stream.py).
        warnings.simplefilter("ignore")
        with lean_tracing(module):
            torch.onnx.export(
                module,
                sample,
                str(path),
                input_names=inputs,
                output_names=outputs,
                dynamic_axes=axes,
                opset_version=OPSET,
                export_params=False,
                keep_initializers_as_inputs=True,
                do_constant_folding=False,
                dynamo=False,
            )
    stream.materialize(path, state)
    log.info("exported %s", path)


def export_serving(model: nn.Module, path: Path, emit_fused: bool = False) -> None:
    """The serving graph: the explicit attention path (whose shape ORT's BERT fusion matches),
    or with `emit_fused` ONNX Runtime's MultiHeadAttention and RotaryEmbedding nodes written
    in its place (export/fused.py)."""
    if config_of(model).attention_impl != "explicit":
        raise ValueError("export needs the explicit attention path: its shape is what ORT fuses")
    out = primary_output(model)
    with ort_kernels(model) if emit_fused else nullcontext():
        if isinstance(model, MultiOutputEncoder):
            names = model.spec.graph_outputs
            axes = {name: output_axes(name) for name in names}
            _export(ServingGraph(model), model, path, names, axes)
        elif isinstance(model, SentenceEncoder):
            axes = {out: {0: "batch"}, TOKENS: {0: "batch", 1: "sequence"}}
            _export(ServingGraph(model), model, path, [out, TOKENS], axes)
        else:
            _export(ServingGraph(model), model, path, [out], {out: {0: "batch"}})


def default_gates(path: Path, n_layers: int, n_heads: int) -> None:
    """Ones (1, L, h) as head_gates' default: a caller that feeds no gates gets the model as it
    is (an initializer named as a graph input is one the caller may override), and the one row
    broadcasts over any batch; a caller that gates feeds (B, L, h)."""
    graph_model = onnx.load(str(path), load_external_data=False)
    ones = np.ones((1, n_layers, n_heads), dtype=np.float32)
    graph_model.graph.initializer.append(numpy_helper.from_array(ones, HEAD_GATES))
    (gates,) = (i for i in graph_model.graph.input if i.name == HEAD_GATES)
    gates.type.tensor_type.shape.dim[0].dim_param = "gate_rows"  # 1 (the default) or B
    onnx.save(graph_model, str(path))


def export_attention(model: nn.Module, path: Path) -> None:
    cfg = config_of(model)
    out = primary_output(model)
    _export(
        AttentionGraph(model),
        model,
        path,
        [out, "attentions"],
        {out: output_axes(out), "attentions": {1: "batch", 3: "sequence", 4: "sequence_k"}},
        gated=True,
    )
    default_gates(path, cfg.n_layers, cfg.n_heads)
