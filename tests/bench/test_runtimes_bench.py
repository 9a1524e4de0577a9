"""bench.runtimes runs end to end (the graph on every path this CPU has; servers are left to
`make bench`): it must not rot, and its rows must say what ran and what could not."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from service.engine.cpu import detect

pytestmark = pytest.mark.slow


def test_runtimes_bench_measures_each_path_this_cpu_has(tiny_bundle, tmp_path):
    done = subprocess.run(
        [
            sys.executable, "-m", "bench.runtimes", "--bundle", str(tiny_bundle),
            "--pairs", "100", "--no-http", "--out", str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "runtimes.json").read_text())
    paths = [(r["runtime"], r["precision"]) for r in result["rows"]]
    assert paths[0] == ("onnxruntime", "fp32") and ("openvino", "fp32") in paths
    assert ("onnxruntime", "int8") in paths  # the tiny bundle has an int8 graph
    assert (("openvino", "bf16") in paths) == detect().bf16
    graphs = json.loads((tiny_bundle / "manifest.json").read_text())["graphs"]
    assert (("openvino", "int8") in paths) == ("encoder_int8_openvino" in graphs)
    assert all(r["graph_texts_per_s"] > 0 and r["short_p50_ms"] > 0 for r in result["rows"])
    ov = result["rows"][paths.index(("openvino", "fp32"))]
    assert ov["min_cosine"] > 0.9999  # fp32 on either runtime: the same vectors
    if not detect().bf16:
        assert any("no bf16 units" in s for s in result["skipped"])
    assert "| openvino | fp32 |" in done.stdout
    auto = result["auto"]  # what the defaults serve here, said in the report
    assert (auto["runtime"], auto["precision"]) == (
        ("openvino", "bf16") if detect().bf16 else ("onnxruntime", "auto")
    )
    assert f"serves {auto['runtime']} {auto['precision']}" in done.stdout


def test_streams_bench_times_both_ways_of_running_openvino(tiny_bundle, tmp_path):
    """bench.streams: one request with every thread against streams with asynchronous
    requests, in each precision this CPU computes."""
    done = subprocess.run(
        [
            sys.executable, "-m", "bench.streams", "--bundle", str(tiny_bundle),
            "--texts", "40", "--rounds", "1", "--http-rounds", "2", "--out", str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "streams.json").read_text())
    rows = results["rows"]
    ways = {(r["precision"], r["way"]) for r in rows}
    precisions = ["fp32", "bf16"] if detect().bf16 else ["fp32"]
    assert ways == {
        (p, w) for p in precisions for w in ("one request, every thread", "streams, async requests")
    }
    one = [r for r in rows if r["way"] == "one request, every thread"]
    assert all(r["streams"] == 1 and r["requests"] == 1 for r in one)  # what headwise compiles
    assert all(r["texts_per_s_32"] > 0 and r["short_p50_ms"] > 0 for r in rows)
    # ... and inside the server: one stream and two (and half the cores), every request answered
    http = {(r["precision"], r["streams"]): r for r in results["http"]}
    assert {(p, 1) for p in precisions} | {(p, 2) for p in precisions} <= set(http)
    assert all(r["errors"] == 0 and r["texts_per_s_32_clients"] > 0 for r in http.values())
    assert all(len(r["throughput_ratios"]) == 2 for r in http.values())  # a ratio a round
    assert all(r["throughput_ratios"] == [1.0, 1.0] for (_, n), r in http.items() if n == 1)
    assert "## In the server" in (tmp_path / "streams.md").read_text()


def test_the_report_sets_http_against_the_graph_each_way_it_was_measured():
    """One text over HTTP against its graph called back to back, and against the graph called
    with the requests' spacing (what is left is the request path's own cost); 32 clients of 32
    texts a request against the graph's texts/s; the first request and one after a pause
    against the steady p50, beside the graph's own after a pause. A recording from before these figures says '-' there."""
    from bench.runtimes import report

    http = {
        "1": {"texts_per_s": 100.0, "p50_ms": 8.0},
        "32": {"texts_per_s": 200.0, "p50_ms": 100.0},
        "32_batched": {"texts_per_s": 380.0, "graph_texts_per_s": 475.0, "p50_ms": 2000.0},
        "short_p50_ms": 4.0,
        "short_graph_p50_ms": 2.0,
        "short_graph_spaced_p50_ms": 3.2,
        "first_short": {"first_over_steady": 1.1, "paused_over_steady": 1.05},
        "first_long": {"first_over_steady": 1.2, "paused_over_steady": 1.3},
        "graph_paused_over_steady": 1.4,
    }
    row = {
        "runtime": "openvino", "precision": "bf16", "graph_texts_per_s": 400.0,
        "graph_vs_ort_fp32": 2.0, "short_p50_ms": 2.1, "recall_at_10": 72.0, "mrr": 50.0,
    }  # fmt: skip
    newer = ("short_graph_spaced_p50_ms", "32_batched", "graph_paused_over_steady")
    old = {k: v for k, v in http.items() if k not in newer}
    old["first_short"] = {"first_over_steady": 1.1}
    results = {
        "machine": {"cpus": 2, "cpu_model": "x", "cpu_shown": ["avx2"], "when": "now"},
        "bundle": "m",
        "rows": [{**row, "http": http}, {**row, "precision": "fp32", "http": old}],
        "skipped": [],
    }
    lines = [line for line in report(results).splitlines() if line.startswith("| openvino")]
    assert "| 0.50x | 380/s, 0.80x | 4.00 / 2.00 ms = 2.00x | 3.20 ms, 1.25x |" in lines[0]
    assert "| 0.50x | - | 4.00 / 2.00 ms = 2.00x | - |" in lines[1]
    # first, and after a pause; the graph alone after a pause
    assert "| 1.10x (1.05x), 1.20x (1.30x); 1.40x |" in lines[0]
    assert "| 1.10x, 1.20x (1.30x) |" in lines[1]


def test_workers_bench_sets_several_processes_against_one(tiny_bundle, tmp_path):
    """bench.workers: one server process and two, in alternating rounds, every request
    answered, each figure a ratio to one process's in the same round."""
    done = subprocess.run(
        [
            sys.executable, "-m", "bench.workers", "--bundle", str(tiny_bundle), "--workers", "2",
            "--rounds", "2", "--requests", "200", "--out", str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "workers.json").read_text())
    (bundle,) = results["bundles"]
    rows = {r["workers"]: r for r in bundle["rows"]}
    assert set(rows) == {1, 2}
    assert all(r["errors"] == 0 and r["texts_per_s"] > 0 for r in rows.values())
    assert rows[1]["texts_per_s_ratios"] == [1.0, 1.0]
    assert len(rows[2]["short_p50_ms_ratios"]) == 2
    assert "| tiny-random (2 layers, d 32) | 2 |" in done.stdout
