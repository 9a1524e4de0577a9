"""MultiHeadAttention: shapes, masks, cross-attention, the two paths agreeing."""

from __future__ import annotations

import math

import pytest
import torch

from models.attention import MultiHeadAttention


@pytest.fixture
def mha() -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(d_model=24, n_heads=4).eval()


def test_output_and_weight_shapes(mha):
    x = torch.randn(3, 7, 24)
    out, w = mha(x, need_weights=True)
    assert out.shape == (3, 7, 24)
    assert w.shape == (3, 4, 7, 7)
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 4, 7))


def test_weights_are_none_unless_asked(mha):
    _, w = mha(torch.randn(1, 3, 24))
    assert w is None


def test_matches_the_textbook_formula_per_head(mha):
    x = torch.randn(2, 5, 24)
    out, w = mha(x, need_weights=True)
    q, k, v = mha.q_proj(x), mha.k_proj(x), mha.v_proj(x)
    heads = []
    for h in range(4):
        s = slice(h * 6, (h + 1) * 6)
        p = torch.softmax(q[..., s] @ k[..., s].transpose(1, 2) / math.sqrt(6), dim=-1)
        torch.testing.assert_close(p, w[:, h])
        heads.append(p @ v[..., s])
    torch.testing.assert_close(out, mha.out_proj(torch.cat(heads, dim=-1)))


def test_padding_keys_get_zero_weight_and_do_not_change_real_rows(mha):
    x = torch.randn(1, 6, 24)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
    out, w = mha(x, key_padding_mask=mask, need_weights=True)
    assert torch.all(w[..., 4:] == 0)
    # The real tokens' outputs equal those of the unpadded sequence.
    short, _ = mha(x[:, :4])
    torch.testing.assert_close(out[:, :4], short, atol=1e-6, rtol=1e-5)


def test_causal_mask_hides_the_future(mha):
    x = torch.randn(2, 5, 24)
    _, w = mha(x, causal=True, need_weights=True)
    upper = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)
    assert torch.all(w[..., upper] == 0)
    # Changing a future token leaves earlier outputs alone.
    out1, _ = mha(x, causal=True)
    x2 = x.clone()
    x2[:, -1] += 5.0
    out2, _ = mha(x2, causal=True)
    torch.testing.assert_close(out1[:, :-1], out2[:, :-1])


def test_cross_attention_takes_keys_from_another_sequence(mha):
    q, kv = torch.randn(2, 3, 24), torch.randn(2, 8, 24)
    out, w = mha(q, kv, kv, key_padding_mask=torch.ones(2, 8), need_weights=True)
    assert out.shape == (2, 3, 24)
    assert w.shape == (2, 4, 3, 8)


def test_all_masked_row_is_finite(mha):
    x = torch.randn(2, 4, 24)
    mask = torch.tensor([[0, 0, 0, 0], [1, 1, 0, 0]])
    for impl in ("explicit", "sdpa"):
        mha.impl = impl
        out, _ = mha(x, key_padding_mask=mask)
        assert torch.isfinite(out).all(), impl
    mha.impl = "explicit"
    _, w = mha(x, key_padding_mask=mask, need_weights=True)
    assert torch.isfinite(w).all()


def test_d_model_not_divisible_names_both_numbers():
    with pytest.raises(ValueError, match=r"d_model \(10\).*n_heads \(3\)"):
        MultiHeadAttention(d_model=10, n_heads=3)


@pytest.mark.parametrize("causal", [False, True])
def test_fast_path_equals_explicit_path(mha, causal):
    x = torch.randn(3, 9, 24)
    mask = torch.ones(3, 9)
    mask[1, 5:] = 0
    mask[2, 2:] = 0
    explicit, _ = mha(x, key_padding_mask=mask, causal=causal)
    mha.impl = "sdpa"
    fast, _ = mha(x, key_padding_mask=mask, causal=causal)
    torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=1e-5)


def test_dropout_on_weights_only_in_training():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, dropout=0.5)
    x = torch.randn(1, 6, 16)
    mha.eval()
    a, _ = mha(x)
    b, _ = mha(x)
    torch.testing.assert_close(a, b)
    mha.train()
    c, _ = mha(x)
    assert not torch.allclose(a, c)


def test_grouped_query_attention_equals_mha_with_each_kv_head_repeated():
    torch.manual_seed(0)
    gqa = MultiHeadAttention(16, 4, n_kv_heads=2, head_dim=6).eval()
    mha = MultiHeadAttention(16, 4, head_dim=6).eval()
    mha.q_proj, mha.out_proj = gqa.q_proj, gqa.out_proj
    for name in ("k_proj", "v_proj"):
        w, b = getattr(gqa, name).weight.view(2, 6, 16), getattr(gqa, name).bias.view(2, 6)
        # query head i reads kv head i // 2: kv heads 0, 0, 1, 1
        getattr(mha, name).weight.data.copy_(w.repeat_interleave(2, 0).reshape(24, 16))
        getattr(mha, name).bias.data.copy_(b.repeat_interleave(2, 0).reshape(24))
    x, keep = torch.randn(2, 7, 16), torch.ones(2, 7)
    keep[1, 4:] = 0
    out, w = gqa(x, key_padding_mask=keep, need_weights=True)
    want, want_w = mha(x, key_padding_mask=keep, need_weights=True)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(w, want_w)
    gqa.impl = "sdpa"
    fast, _ = gqa(x, key_padding_mask=keep)
    torch.testing.assert_close(fast, out, atol=1e-5, rtol=1e-5)


def test_scores_are_divided_by_the_square_root_of_scale_dim():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, scale_dim=9).eval()
    x = torch.randn(1, 4, 8)
    _, w = mha(x, need_weights=True)
    q = mha.q_proj(x).view(1, 4, 2, 4).transpose(1, 2)
    k = mha.k_proj(x).view(1, 4, 2, 4).transpose(1, 2)
    torch.testing.assert_close(w, torch.softmax(q @ k.transpose(-1, -2) / 3.0, dim=-1))


def test_soft_capping_equals_gemma2_attention():
    from transformers import Gemma2Config
    from transformers.models.gemma2.modeling_gemma2 import Gemma2Attention

    torch.manual_seed(0)
    cfg = Gemma2Config(
        hidden_size=16,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        query_pre_attn_scalar=8,
        attn_logit_softcapping=3.0,
    )
    cfg._attn_implementation = "eager"
    theirs = Gemma2Attention(cfg, layer_idx=1).eval()
    ours = MultiHeadAttention(16, 2, bias=False, head_dim=8, softcap=3.0).eval()
    pairs = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "out_proj": "o_proj"}
    with torch.no_grad():
        for mine, other in pairs.items():
            getattr(theirs, other).weight.mul_(4.0)  # scores well past the cap
            getattr(ours, mine).weight.copy_(getattr(theirs, other).weight)
        x = torch.randn(1, 5, 16)
        no_rotation = (torch.ones(1, 5, 8), torch.zeros(1, 5, 8))  # (cos, sin)
        want, want_w = theirs(x, no_rotation, None)
        got, got_w = ours(x, need_weights=True)
    torch.testing.assert_close(got_w, want_w)
    torch.testing.assert_close(got, want)
