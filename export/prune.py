"""Pruning at export: the least important heads and FFN neurons of an embedder removed, iteratively
as Michel, Levy & Neubig (2019) do, an optional recovery by distillation, and a retrieval gate.

Each step scores what is left on the training pairs (export/heads.py's gradient of the in-batch
contrastive loss: a head's |∂L/∂ξ_h|; an FFN neuron's |Σ_i W_2[i, j] ∂L/∂W_2[i, j]|, the same
derivative for a gate on the neuron, as TextPruner scores them), normalised per layer, and
removes the lowest `step` of the original count until the fractions asked for are gone. A layer
keeps at least one head and one neuron. Recovery (`recover` steps) distils the unpruned model's
embeddings of the same texts into the pruned one: MSE, AdamW, linear warm-up over the first 10 %
of the steps, then linear decay, on the CPU.

The gate: recall@10 and MRR of the pruned model on held-out pairs (never used to score or to
recover) within `max_drop` points of the unpruned model's, else the export fails with the
figures (PruningGateError).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from export.heads import Corpus, Encoder, gradients
from models.encoder import SentenceEncoder, config_of
from models.families import PRUNING_KEY, family_of
from models.pruning import (
    ffn_output,
    ffn_width,
    layers_of,
    remove_heads,
    remove_neurons,
    why_not_prunable,
)
from models.weights import INDEX_SUFFIX, WEIGHT_FILES, LoadedModel, read_state_dict
from service.engine import quality
from service.manifest import Pruning, RetrievalQuality

log = logging.getLogger(__name__)


class PruningGateError(ValueError):
    """The pruned model lost more retrieval than the gate allows."""


@dataclass(frozen=True)
class PruneOptions:
    heads: float = 0.0  # fraction of all heads to remove
    ffn: float = 0.0  # fraction of all FFN neurons to remove
    step: float = 0.1  # of the original count, removed per scoring round
    recover: int = 0  # distillation steps after pruning (0: none)
    batch_size: int = 32
    learning_rate: float = 5e-5
    recover_tokens: int = 64  # recovery's texts cut at this many tokens (its cost on the CPU)
    max_drop: float = quality.MAX_DROP_POINTS  # the gate, in points of recall@10 and MRR
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("heads", "ffn"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(
                    f"--prune-{name} is a fraction in [0, 1), got {getattr(self, name)}"
                )
        if not 0.0 < self.step <= 1.0:
            raise ValueError(f"the pruning step is a fraction in (0, 1], got {self.step}")


@dataclass
class Pruned:
    """What was removed, and what the gate measured."""

    removed_heads: list[list[int]]  # per layer, original head indices
    ffn_sizes: list[int]  # per layer, neurons left
    ffn_removed: int
    rounds: int
    recovered_steps: int
    quality: RetrievalQuality
    seconds: float
    losses: list[float] = field(default_factory=list)  # recovery's MSE, every 10 % of the steps


def _scores(
    encode: Encoder, corpus: Corpus, batch_size: int
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per head (L, h_max; removed heads NaN) and per layer's FFN neuron, the mean over batches
    of the absolute derivative of the contrastive loss (export/heads.py)."""
    layers = layers_of(encode.model)
    heads, neurons = gradients(
        encode, corpus, batch_size, [ffn_output(layer.ffn) for layer in layers]
    )
    for i, layer in enumerate(layers):  # heads already removed: not candidates
        heads[i, [h for h in range(encode.heads) if h not in layer.kept]] = np.nan
    return heads, neurons


def _per_layer(values: np.ndarray) -> np.ndarray:
    """Each layer's scores divided by their L2 norm (NaN: removed, left out of it)."""
    norm = np.sqrt(np.nansum(values**2, axis=-1, keepdims=True)) + 1e-20
    out: np.ndarray = values / norm
    return out


def _lowest_heads(scores: np.ndarray, count: int) -> dict[int, list[int]]:
    """The `count` lowest heads by per-layer normalised score, leaving each layer one."""
    normed = _per_layer(scores)
    left = (~np.isnan(normed)).sum(1)
    chosen: dict[int, list[int]] = {}
    for flat in np.argsort(np.nan_to_num(normed, nan=np.inf), axis=None, kind="stable"):
        layer, head = divmod(int(flat), scores.shape[1])
        if np.isnan(normed[layer, head]):
            break  # the rest are removed already
        if len(chosen.get(layer, [])) >= left[layer] - 1:
            continue  # a layer keeps its last head
        chosen.setdefault(layer, []).append(head)
        if sum(len(v) for v in chosen.values()) == count:
            break
    return chosen


def _lowest_neurons(scores: list[np.ndarray], count: int) -> dict[int, list[int]]:
    """The `count` lowest FFN neurons by per-layer normalised score, leaving each layer one."""
    flat = [
        (float(v), layer, j) for layer, s in enumerate(scores) for j, v in enumerate(_per_layer(s))
    ]
    flat.sort()
    chosen: dict[int, list[int]] = {}
    for _, layer, j in flat:
        if len(chosen.get(layer, [])) >= len(scores[layer]) - 1:
            continue
        chosen.setdefault(layer, []).append(j)
        if sum(len(v) for v in chosen.values()) == count:
            break
    return chosen


def _embed(encode: Encoder, texts: list[str], batch_size: int) -> np.ndarray:
    ones = torch.ones(encode.layers, encode.heads)
    with torch.no_grad():
        parts = [encode(texts[i : i + batch_size], ones) for i in range(0, len(texts), batch_size)]
    return torch.cat(parts).numpy()


def recover(
    student: Encoder, teacher: Encoder, texts: list[str], options: PruneOptions
) -> list[float]:
    """Distil the teacher's pooled embeddings into the student (MSE, AdamW, warm-up)."""
    torch.manual_seed(options.seed)
    model = student.model
    for encoder in (student, teacher):  # cut short: a step costs its tokens, forward and back
        encoder.tokenizer.enable_truncation(min(options.recover_tokens, encoder.max_length))
    params = [p for p in model.parameters()]
    for p in params:
        p.requires_grad_(True)
    optimiser = torch.optim.AdamW(params, lr=options.learning_rate, weight_decay=0.0)
    warmup = max(1, options.recover // 10)

    def rate(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (options.recover - step) / max(1, options.recover - warmup))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, rate)
    generator = np.random.default_rng(options.seed)
    losses: list[float] = []
    model.train()
    try:
        for step in range(options.recover):
            batch = [
                texts[i] for i in generator.choice(len(texts), options.batch_size, replace=False)
            ]
            with torch.no_grad():
                target = teacher.pooled(batch)
            loss = torch.nn.functional.mse_loss(student.pooled(batch), target)
            optimiser.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimiser.step()
            schedule.step()
            if step % max(1, options.recover // 10) == 0 or step == options.recover - 1:
                losses.append(float(loss.detach()))
    finally:
        model.eval()
        for p in params:
            p.requires_grad_(False)
        for encoder in (student, teacher):
            encoder.tokenizer.enable_truncation(encoder.max_length)
    return losses


def prune(
    loaded: LoadedModel,
    teacher: LoadedModel,
    train: Corpus,
    held_out: Corpus,
    options: PruneOptions,
    corpus_name: str = "held-out pairs",
) -> Pruned:
    """Prune `loaded`'s model in place (`teacher`: an unpruned copy, for recovery and the gate)."""
    cfg = config_of(loaded.model)
    if (why := why_not_prunable(cfg)) is not None:
        raise ValueError(why)
    if train.documents is None or held_out.documents is None:
        raise ValueError("pruning scores and gates on query -> positive pairs, not plain texts")
    started = time.perf_counter()
    student, reference = Encoder(loaded), Encoder(teacher)
    total_heads = cfg.n_layers * cfg.n_heads
    total_neurons = sum(ffn_width(layer.ffn) for layer in layers_of(loaded.model))
    goal_heads, goal_neurons = (
        round(options.heads * total_heads),
        round(options.ffn * total_neurons),
    )
    per_heads = max(1, math.ceil(options.step * total_heads))
    per_neurons = max(1, math.ceil(options.step * total_neurons))
    removed_heads = removed_neurons = rounds = 0
    while removed_heads < goal_heads or removed_neurons < goal_neurons:
        heads, neurons = _scores(student, train, options.batch_size)
        take = min(per_heads, goal_heads - removed_heads)
        if take > 0:
            chosen = _lowest_heads(heads, take)
            if chosen:
                remove_heads(loaded.model, chosen)
                removed_heads += sum(len(v) for v in chosen.values())
            else:  # every layer is down to one head
                goal_heads = removed_heads
        take = min(per_neurons, goal_neurons - removed_neurons)
        if take > 0:
            chosen_neurons = _lowest_neurons(neurons, take)
            if chosen_neurons:
                remove_neurons(loaded.model, chosen_neurons)
                removed_neurons += sum(len(v) for v in chosen_neurons.values())
            else:  # every layer is down to one neuron
                goal_neurons = removed_neurons
        rounds += 1
        log.info(
            "pruning round %d: %d/%d heads and %d/%d FFN neurons removed",
            rounds, removed_heads, total_heads, removed_neurons, total_neurons,
        )  # fmt: skip
    losses: list[float] = []
    if options.recover:
        texts = train.texts + train.documents
        losses = recover(student, reference, texts, options)
        log.info(
            "recovery: %d steps, MSE %s", options.recover, " -> ".join(f"{x:.4g}" for x in losses)
        )
    unpruned = (
        _embed(reference, held_out.texts, options.batch_size),
        _embed(reference, held_out.documents, options.batch_size),
    )
    pruned = (
        _embed(student, held_out.texts, options.batch_size),
        _embed(student, held_out.documents, options.batch_size),
    )
    measured = quality.measure(unpruned, pruned, corpus_name).model_copy(
        update={"max_drop_allowed": options.max_drop}
    )
    cfg = config_of(loaded.model)
    result = Pruned(
        removed_heads=[
            [h for h in range(cfg.n_heads) if h not in kept] for kept in cfg.layer_heads()
        ],
        ffn_sizes=[ffn_width(layer.ffn) for layer in layers_of(loaded.model)],
        ffn_removed=removed_neurons,
        rounds=rounds,
        recovered_steps=options.recover,
        quality=measured,
        seconds=time.perf_counter() - started,
        losses=losses,
    )
    log.info("pruned: %s", quality.summary(measured))
    if measured.max_drop > options.max_drop:
        raise PruningGateError(
            f"pruning {removed_heads} of {total_heads} heads and {removed_neurons} of "
            f"{total_neurons} FFN neurons lost {measured.max_drop:.2f} points of recall@10 or "
            f"MRR on {measured.pairs} held-out pairs, more than the {options.max_drop} allowed: "
            f"{quality.summary(measured)}; prune less, or add --recover STEPS"
        )
    return result


def describe(p: Pruning) -> str:
    """One line of what a pruning removed and what its gate measured."""
    left = sum(p.ffn_sizes)
    return (
        f"{p.heads_removed} heads and {p.ffn_removed} of {left + p.ffn_removed} FFN neurons "
        f"removed in {p.rounds} rounds on {p.training_pairs} pairs"
        f"{f', {p.recovered_steps} recovery steps' if p.recovered_steps else ''}; "
        f"{quality.summary(p.quality)} (unpruned in parentheses)"
    )


def split_held_out(corpus: Corpus, share: int = 5) -> tuple[Corpus, Corpus]:
    """(training, held out): one pair in `share` held out, chosen by a hash of its query, so
    the gate measures pairs the pruning never saw."""
    assert corpus.documents is not None
    train: tuple[list[str], list[str]] = ([], [])
    held: tuple[list[str], list[str]] = ([], [])
    for q, d in zip(corpus.texts, corpus.documents, strict=True):
        side = held if int(hashlib.sha256(q.encode()).hexdigest()[-4:], 16) % share == 0 else train
        side[0].append(q)
        side[1].append(d)
    if len(held[0]) < 10 or len(train[0]) < 2:
        raise ValueError(
            f"{len(corpus)} pairs split into {len(train[0])} to prune on and {len(held[0])} held "
            "out for the gate: give more pairs (the gate needs at least 10)"
        )
    return Corpus(*train), Corpus(*held)


def write_checkpoint(loaded: LoadedModel, out: Path) -> Path:
    """The pruned model as a checkpoint of its own, loadable by `headwise export --model`: the
    source folder's files (tokenizer, sentence-transformers modules, ...), its config.json with
    what stays of each layer (PRUNING_KEY), and its weights under the checkpoint's own names.
    A family whose tensors are not ours one to one (fused on load) is refused."""
    from safetensors.torch import save_file

    source = loaded.source
    hf = json.loads((source / "config.json").read_text(encoding="utf-8"))
    family = family_of(hf)
    with_head = not isinstance(loaded.model, SentenceEncoder)
    ours = loaded.model.state_dict()
    weights: dict[str, Tensor] = {}
    for name, tensor in read_state_dict(source).items():
        parts = family.tensors(name, tensor, with_head)
        if len(parts) > 1:
            raise ValueError(
                f"{name} is fused on load: this family's pruned checkpoint is not written"
            )
        if parts and parts[0][0] in ours:
            if parts[0][1] is not tensor:
                raise ValueError(
                    f"{name} is transformed on load: the pruned checkpoint is not written"
                )
            weights[name] = ours[parts[0][0]].detach().to(tensor.dtype).contiguous()
        else:
            weights[name] = tensor  # a tensor we do not use, kept as stored
    cfg = config_of(loaded.model)
    hf[PRUNING_KEY] = {
        "kept_heads": [list(k) for k in cfg.layer_heads()],
        "ffn_sizes": [cfg.layer_ffn(i) for i in range(cfg.n_layers)],
    }
    weight_files = {*WEIGHT_FILES, *(w + INDEX_SUFFIX for w in WEIGHT_FILES), "config.json"}
    shards = {p.name for p in source.glob("*.safetensors")} | {p.name for p in source.glob("*.bin")}
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(source, out, ignore=lambda folder, names: [
        n for n in names if Path(folder) == source and (n in weight_files or n in shards)
    ])  # fmt: skip
    (out / "config.json").write_text(json.dumps(hf, indent=2) + "\n", encoding="utf-8")
    save_file(weights, str(out / "model.safetensors"))
    log.info("pruned checkpoint written to %s", out)
    return out
