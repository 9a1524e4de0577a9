"""Gated FFNs: the activated branch is the gate, as transformers' Gemma MLP has it."""

from __future__ import annotations

import torch

from models.ffn import GatedFeedForward, make_ffn


def test_geglu_tanh_equals_gemma3_mlp():
    from transformers import Gemma3TextConfig
    from transformers.models.gemma3.modeling_gemma3 import Gemma3MLP

    theirs = Gemma3MLP(Gemma3TextConfig(hidden_size=8, intermediate_size=12))
    ours = GatedFeedForward(8, 12, "geglu_tanh", bias=False)
    ours.gate.weight.data.copy_(theirs.gate_proj.weight)
    ours.up.weight.data.copy_(theirs.up_proj.weight)
    ours.down.weight.data.copy_(theirs.down_proj.weight)
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(ours(x), theirs(x))


def test_swiglu_is_silu_of_the_gate_times_up():
    ffn = make_ffn("swiglu", 6, 10)
    x = torch.randn(4, 6)
    want = ffn.down(torch.nn.functional.silu(ffn.gate(x)) * ffn.up(x))
    torch.testing.assert_close(ffn(x), want)
