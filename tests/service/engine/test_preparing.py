"""What preparing a request costs (tokenising): calibrated at warm-up, refined by the requests
that ran alone, priced by admission before a request is tokenised."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from service.engine.preparing import MIN_CHARS, TEXTS, TOKENS, PrepareCost, calibrate, sample_texts


def test_served_requests_refine_the_rate_and_the_cores_share_it():
    cost = PrepareCost(parallel=2)
    assert cost.seconds(10_000) == 0.0 and cost.source == "not measured"
    cost.calibrated(1e-6)
    assert cost.seconds(10_000) == pytest.approx(0.005) and cost.source == "calibrated"
    cost.observe(MIN_CHARS - 1, 1.0)  # its time is the call's fixed cost
    assert cost.per_char_s == pytest.approx(1e-6) and cost.measured == 0
    for _ in range(40):
        cost.observe(10_000, 0.03)  # 3 µs of CPU a character, served
    assert cost.per_char_s == pytest.approx(3e-6, rel=0.01)
    assert cost.seconds(10_000) == pytest.approx(0.015, rel=0.01)  # two cores tokenise at once
    assert cost.describe() == {
        "source": "measured",
        "per_char_cpu_s": cost.per_char_s,
        "parallel": 2,
        "requests_measured": 40,
    }


def test_calibration_times_the_tokenizer_per_character():
    """A tokenizer that takes 2 µs a character (and whose encodings are read as the pipelines
    read them) is calibrated at about that."""
    read = []

    def tokenize(texts: list[str]) -> list[SimpleNamespace]:
        time.sleep(2e-6 * sum(map(len, texts)))
        read.append(len(texts))
        return [SimpleNamespace(ids=[1, 2], overflowing=[]) for _ in texts]

    texts = ["x" * 500] * 16
    per_char_s = calibrate(tokenize, texts)
    assert 2e-6 <= per_char_s < 4e-6
    assert read == [16] * 4  # once untimed, then the best of three


def test_calibration_text_is_the_vocabulary_decoded():
    seen: list[list[int]] = []

    def decode(ids: list[int]) -> str:
        seen.append(ids)
        return " ".join(f"w{i}" for i in ids)

    texts = sample_texts(decode, 30522)
    assert len(texts) == TEXTS and all(len(ids) == TOKENS for ids in seen)
    assert min(min(ids) for ids in seen) >= 1000  # past the special and unused ids
    assert sample_texts(decode, 30522) == texts  # the same every start


def test_a_served_model_calibrates_its_tokenizer_and_shows_it(tiny_bundle):
    from tests.service.conftest import client_for

    with client_for(tiny_bundle) as c:
        shown = c.get("/info").json()["tokenising"]["tiny-random"]
        assert shown["source"] == "calibrated"
        assert 1e-9 < shown["per_char_cpu_s"] < 1e-4  # a fast tokenizer: ~0.3 µs a character
        text = " ".join(["the cat sat on the mat"] * 20)
        assert c.post("/encode", json={"inputs": [text] * 32}).status_code == 200
        after = c.get("/info").json()["tokenising"]["tiny-random"]
    assert after["source"] == "measured" and after["requests_measured"] == 1


def test_nothing_is_learnt_where_the_operator_states_the_rate():
    cost = PrepareCost(learns=False)
    cost.observe(10_000, 0.03)
    assert cost.seconds(10_000) == 0.0 and cost.measured == 0
