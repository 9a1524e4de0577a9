"""Padding a batch and cosine: the helpers export, service and bench share."""

from __future__ import annotations

import numpy as np

from service.tensors import Batch, cosines, l2_normalize, pad_batch


def test_pad_batch_right_pads_with_the_pad_id_and_masks_it():
    ids, mask = pad_batch([[5, 6, 7], [8]], pad_id=1)
    assert ids.tolist() == [[5, 6, 7], [8, 1, 1]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert ids.dtype == mask.dtype == np.int64


def test_batch_feeds_only_the_inputs_a_graph_takes():
    b = Batch.of([[5, 6], [7]], types=[[0, 1], [0]])
    assert set(b.feeds(["input_ids", "attention_mask"])) == {"input_ids", "attention_mask"}
    assert b.feeds(["input_ids", "attention_mask", "token_type_ids"])["token_type_ids"].tolist() == [
        [0, 1],
        [0, 0],
    ]
    plain = Batch.of([[5]])
    assert plain.token_type_ids is None
    assert plain.feeds(["input_ids", "token_type_ids"])["token_type_ids"].tolist() == [[0]]


def test_cosines_and_normalisation():
    a = np.array([[1.0, 0.0], [1.0, 1.0]])
    b = np.array([[2.0, 0.0], [-1.0, -1.0]])
    np.testing.assert_allclose(cosines(a, b), [1.0, -1.0])
    np.testing.assert_allclose(np.linalg.norm(l2_normalize(a), axis=1), 1.0)
    assert np.all(l2_normalize(np.zeros((1, 3))) == 0)  # no NaN for a zero vector


def test_a_sequence_may_bring_its_own_mask_which_padding_extends_with_zeros():
    b = Batch.of([[5, 6, 7], [8, 9]], masks=[[1, 0, 1], None])
    assert b.attention_mask.tolist() == [[1, 0, 1], [1, 1, 0]]
    assert b.input_ids.tolist() == [[5, 6, 7], [8, 9, 0]]  # the left-out token keeps its id
