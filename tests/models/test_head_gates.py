"""Head gates (Michel et al. 2019): a gate of 0 on head i removes exactly that head's output,
as zeroing its d_k input columns of W_O does, in our module and in transformers' own models;
gates of 1 change nothing; each row of a batch has its own gates."""

from __future__ import annotations

import pytest
import torch

from models.attention import MultiHeadAttention
from models.weights import load_pretrained
from tests.models import test_qwen3
from tests.models.checkpoints import TOLERANCE, batch, save_checkpoint

BERT = {
    "vocab_size": 100,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
}


@pytest.mark.parametrize("impl", ["explicit", "sdpa"])
def test_a_zero_gate_equals_zeroing_the_heads_columns_of_w_o(impl):
    torch.manual_seed(0)
    mha = MultiHeadAttention(24, 4, impl=impl).eval()
    x = torch.randn(3, 7, 24)
    gates = torch.ones(3, 4)
    gates[0, 1] = 0.0  # row 0 without head 1, row 1 without head 3, row 2 whole
    gates[1, 3] = 0.0
    with torch.no_grad():
        got, _ = mha(x, head_gates=gates)
        whole, _ = mha(x)
        for row, head in ((0, 1), (1, 3)):
            cut = MultiHeadAttention(24, 4, impl=impl).eval()
            cut.load_state_dict(mha.state_dict())
            cut.out_proj.weight[:, head * 6 : (head + 1) * 6] = 0.0
            want, _ = cut(x[row : row + 1])
            torch.testing.assert_close(got[row : row + 1], want)
    torch.testing.assert_close(got[2], whole[2])
    assert (got[0] - whole[0]).abs().max() > 1e-2  # the gate did something


def test_gates_scale_the_heads_output_linearly():
    torch.manual_seed(1)
    mha = MultiHeadAttention(24, 4).eval()
    x = torch.randn(1, 5, 24)
    with torch.no_grad():
        half, _ = mha(x, head_gates=torch.tensor([[1.0, 0.5, 1.0, 1.0]]))
        zero, _ = mha(x, head_gates=torch.tensor([[1.0, 0.0, 1.0, 1.0]]))
        one, _ = mha(x, head_gates=torch.ones(1, 4))
    torch.testing.assert_close(half, (zero + one) / 2, atol=1e-6, rtol=1e-5)


def _zero_heads_columns(hf: torch.nn.Module, layer: int, head: int, d_k: int, which: str) -> None:
    weight = dict(hf.named_parameters())[which.format(layer=layer)]
    with torch.no_grad():
        weight[:, head * d_k : (head + 1) * d_k] = 0.0


@pytest.mark.parametrize(
    ("model_class", "config_class", "config", "o_proj"),
    [
        ("BertModel", "BertConfig", BERT, "encoder.layer.{layer}.attention.output.dense.weight"),
        (
            "Qwen3Model",
            "Qwen3Config",
            test_qwen3.CONFIG,
            "layers.{layer}.self_attn.o_proj.weight",
        ),
    ],
    ids=["bert", "qwen3-gqa"],
)
def test_gating_a_head_equals_transformers_with_that_head_cut_out(
    tmp_path, model_class, config_class, config, o_proj
):
    hf = save_checkpoint(tmp_path, model_class, config_class, **config)
    if config_class == "Qwen3Config":
        test_qwen3.write_tokenizer(tmp_path)
    model = load_pretrained(tmp_path).model
    encoder = model.encoder
    n_layers, n_heads = encoder.cfg.n_layers, encoder.cfg.n_heads
    d_k = encoder.layers[0].attn.d_k
    ids, mask = batch([9, 6])
    for layer, head in ((0, 2), (n_layers - 1, 0)):
        gates = torch.ones(2, n_layers, n_heads)
        gates[:, layer, head] = 0.0
        with torch.no_grad():
            got = encoder(ids, mask, head_gates=gates).hidden
        cut = type(hf)(hf.config)
        cut.load_state_dict(hf.state_dict())
        cut.eval()
        _zero_heads_columns(cut, layer, head, d_k, o_proj)
        with torch.no_grad():
            want = cut(input_ids=ids, attention_mask=mask).last_hidden_state
        real = mask.bool()
        diff = (got[real] - want[real]).abs().max().item()
        assert diff < TOLERANCE, f"layer {layer} head {head}: {diff:.3g}"
        with torch.no_grad():
            whole = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        assert (whole[real] - want[real]).abs().max() > 1e-2  # the head mattered


def test_the_fused_path_refuses_gates_rather_than_ignoring_them():
    class Kernels:
        def attend(self, *args, **kwargs):  # pragma: no cover - never reached
            raise AssertionError

    mha = MultiHeadAttention(24, 4).eval()
    mha.kernels = Kernels()  # type: ignore[assignment]
    with pytest.raises(ValueError, match="explicit path"):
        mha(torch.randn(1, 3, 24), head_gates=torch.ones(1, 4))
