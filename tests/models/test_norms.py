"""RMSNorm and Gemma's (1 + w) variant against transformers' own modules."""

from __future__ import annotations

import torch

from models.norms import RMSNorm, make_norm


def test_gemma_offset_rmsnorm_equals_gemma3rmsnorm():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    theirs, ours = Gemma3RMSNorm(12, eps=1e-6), RMSNorm(12, eps=1e-6, offset=True)
    w = torch.randn(12) * 0.1
    theirs.weight.data.copy_(w)
    ours.weight.data.copy_(w)
    x = torch.randn(3, 5, 12)
    torch.testing.assert_close(ours(x), theirs(x))


def test_plain_rmsnorm_equals_llama_rmsnorm():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    theirs, ours = LlamaRMSNorm(12, eps=1e-5), RMSNorm(12, eps=1e-5)
    w = 1 + torch.randn(12) * 0.1
    theirs.weight.data.copy_(w)
    ours.weight.data.copy_(w)
    x = torch.randn(3, 5, 12)
    torch.testing.assert_close(ours(x), theirs(x))


def test_layernorm_without_bias_has_no_bias_tensor():
    norm = make_norm("layer", 8, 1e-5, bias=False)
    assert norm.bias is None and set(dict(norm.named_parameters())) == {"weight"}
