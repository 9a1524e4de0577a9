"""A model whose weights are held in half precision, computed in float32.

A bfloat16 or float16 checkpoint loaded for export keeps its weights as stored (load_pretrained
with keep_half): half the memory of float32 copies, which is what lets a 0.6B decoder's export
fit in about twice its checkpoint. Its float32 graphs are traced without the weights
(export/stream.py), and its reference outputs are computed here: inside `float32_compute`,
every torch function or tensor method that is handed one of the model's half-precision
tensors gets its float32 copy instead, made for that call and dropped after it. The result is
the float32 model's, exactly (float32 holds every bfloat16 and float16 value), while at most
one weight's float32 copy exists at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import chain
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

HALF = (torch.float16, torch.bfloat16)


def half_tensors(model: nn.Module) -> list[Tensor]:
    """The model's parameters and buffers stored in half precision."""
    return [t for t in chain(model.parameters(), model.buffers()) if t.dtype in HALF]


class _Upcast(TorchFunctionMode):
    """Hands every call float32 copies of the tensors whose ids it holds."""

    def __init__(self, stored: set[int]) -> None:
        super().__init__()
        self.stored = stored

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        def up(x: Any) -> Any:
            return x.float() if isinstance(x, Tensor) and id(x) in self.stored else x

        return func(*tree_map(up, args), **tree_map(up, kwargs or {}))


@contextmanager
def float32_compute(model: nn.Module) -> Iterator[None]:
    """Inside the block the model computes in float32 whatever its weights' dtype (module
    docstring); a float32 model is left alone."""
    stored = {id(t) for t in half_tensors(model)}
    if not stored:
        yield
        return
    with _Upcast(stored):
        yield
