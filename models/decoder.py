"""What a decoder (causal, `cfg.causal`) adds on top of the one stack: its heads, which read the
last token's vector (the only one that has seen the whole text).

    classifier (Qwen3ForSequenceClassification):   logits = W_score · h_last
    yes/no reranker (a causal LM, Qwen3-Reranker):  logit  = (w_yes - w_no) · h_last

h_last is the final-normed vector of the last real token. The reranker is a language model
asked to answer "yes" or "no" (its prompt says so): P(yes) = softmax([z_no, z_yes])[1], with
z = W_lm · h_last, which is sigmoid(z_yes - z_no) = sigmoid((w_yes - w_no) · h_last). So two
rows of the LM head are all it needs: one logit whose sigmoid is exactly the card's score.

"Last" is found through the mask (left or right padding); the classifier also skips tokens
equal to the pad id, as transformers pools it (`input_ids != pad_token_id`): a tokenizer that
pads with its end token pools the token before it, there as here.

Why headwise pads on the right, where Qwen3-Reranker's card pads on the left: its left-padded
batch starts every row's positions at the padding (position ids count columns, not tokens), so
a pair's score shifts with the longest pair it happens to be batched with. On the right, causal
attention never lets a token see the padding after it and positions start at the pair's first
token: each pair scores exactly as the card scores it alone, whatever it is batched with.
"""

from __future__ import annotations

from typing import cast

from torch import Tensor, nn

from models.config import EncoderConfig
from models.encoder import Encoder
from models.pooling import last_token_pool


def judge_weight(lm_head: Tensor, yes: int, no: int) -> Tensor:
    """The yes/no reranker's one output row from the LM head's (vocab, d) matrix: (1, d)."""
    return (lm_head[yes].float() - lm_head[no].float())[None, :]


class LastTokenHead(nn.Module):
    """Decoder + one bias-free projection of the last token's vector: (B, N) -> (B, outputs).

    skip_id: the token id that never counts as the last one (transformers' classifier skips its
    pad id); None: the last real token by the mask alone (the reranker)."""

    def __init__(self, cfg: EncoderConfig, outputs: int, skip_id: int | None = None) -> None:
        super().__init__()
        if outputs < 1:
            raise ValueError(f"outputs must be >= 1, got {outputs}")
        if not cfg.causal:
            raise ValueError("a last-token head reads a causal decoder's last vector")
        self.cfg = cfg
        self.num_labels = outputs
        self.skip_id = skip_id
        self.encoder = Encoder(cfg)
        self.head = nn.Module()
        self.head.out = nn.Linear(cfg.d_model, outputs, bias=False)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor | None = None,
        need_weights: bool = False,
        head_gates: Tensor | None = None,
    ) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        out = self.encoder(
            input_ids, attention_mask, need_weights=need_weights, head_gates=head_gates
        )
        counted = attention_mask
        if self.skip_id is not None:
            counted = attention_mask * (input_ids != self.skip_id).to(attention_mask.dtype)
        last = last_token_pool(out.hidden, counted)  # (B, d)
        logits = cast(nn.Linear, self.head.out)(last)  # (B, outputs)
        return logits, out.attentions
