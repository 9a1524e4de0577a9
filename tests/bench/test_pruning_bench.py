"""bench.pruning's parts that need no pruning run (that is `make bench`'s): multiply-adds counted
from a serving graph equal the encoder's own arithmetic, and the report says which settings the
gate would refuse and whether the fastest inside it reaches 1.2x."""

from __future__ import annotations

from bench.pruning import multiply_adds, report
from service.manifest import Manifest


def test_multiply_adds_are_the_encoders_arithmetic(tiny_bundle):
    m = Manifest.model_validate_json((tiny_bundle / "manifest.json").read_text())
    n, d, f = 128, m.d_model, m.d_ff
    per_layer = n * d * 3 * d + 2 * n * n * d + n * d * d + 2 * n * d * f
    assert multiply_adds(tiny_bundle / "encoder.onnx", n) == m.num_layers * per_layer


def row(name, speedup, drop=None):
    r = {
        "setting": name, "multiply_adds_128": 1e9 / speedup, "macs_vs_unpruned": 1 / speedup,
        "graph_texts_per_s": 100 * speedup, "graph_speedup": speedup,
        "http_texts_per_s": 80 * speedup, "http_speedup": speedup,
    }  # fmt: skip
    if drop is not None:
        r |= {
            "heads_removed": 18, "ffn_removed": 0, "recovered_steps": 0, "recall_at_10": 80 - drop,
            "mrr": 60, "unpruned_recall_at_10": 80, "unpruned_mrr": 60, "max_drop": drop,
            "within_gate": drop <= 0.5, "pairs": 500,
        }  # fmt: skip
    return r


def test_the_report_marks_the_gate_and_the_fastest_inside_it():
    machine = {"cpus": 2, "cpu_model": "x", "cpu_shown": ["avx2"], "when": "now"}
    rows = [row("unpruned", 1.0), row("a", 1.1, 0.2), row("b", 1.5, 2.0)]
    text = report({"machine": machine, "rows": rows})
    assert "| a | 18 / 72 |" in text and "| within |" in text and "| refused |" in text
    assert "Fastest inside the gate over HTTP: a, 1.10x (short of the 1.2x goal)" in text
