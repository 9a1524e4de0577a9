"""The benchmark harness runs end to end (tiny bundle, few requests): it must not rot."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.corpus import sentences
from bench.report import render

pytestmark = pytest.mark.slow


def test_corpus_is_fixed_real_and_mixed_length():
    texts = sentences(64)
    assert texts == sentences(64)
    lengths = [len(t.split()) for t in texts]
    assert min(lengths) >= 6 and max(lengths) <= 45 and len(set(lengths)) > 10


def test_bench_runs_and_reports_ratios(tiny_bundle, tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--bundle",
            str(tiny_bundle),
            "--texts",
            "48",
            "--requests",
            "60",
            "--concurrency",
            "1,4",
            "--json",
            str(out),
            "--quality-pairs",
            "16",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["graph_direct"] > 0 and result["gemm_peak_gflops"] > 0
    assert [run["concurrency"] for run in result["http"]] == [1, 4]
    assert all(run["errors"] == 0 and run["texts_per_s"] > 0 for run in result["http"])
    assert 0 < result["int8"]["min_cosine"] <= 1 and result["int8"]["speedup"] > 0
    assert result["int8"]["http"]["int8_texts_per_s"] > 0
    holdout = result["int8"]["holdout"]
    assert holdout["pairs"] == 16 and holdout["split"] == "holdout"
    table = render(result)
    assert "vs graph direct" in table and "| 4 clients |" in table
    assert "held-out query -> document pairs" in table
    assert table in done.stdout
    assert out.with_suffix(".md").read_text() == table + "\n"
    assert {p.name for p in tmp_path.glob("*.png")} == {
        "bench-throughput.png",
        "bench-latency.png",
    }


def test_gpu_check_runs_every_step_but_the_cuda_ones_in_its_dry_mode(tiny_bundle, tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.gpu",
            "--bundle",
            str(tiny_bundle),
            "--dry-run",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["dry_run"] is True
    assert result["parity"]["encoder"]["min_cosine"] >= 0.99999
    assert {(g["batch"], g["length"]) for g in result["graph"]["encoder"]} == {
        (1, 8),
        (1, 16),
        (4, 8),
        (4, 16),
    }
    assert all(g["iobinding_ms"] > 0 for g in result["graph"]["encoder"])
    runs = result["http"]["runs"]
    assert [(h["texts_per_request"], h["clients"]) for h in runs] == [(1, 1), (1, 4), (32, 1)]
    assert all(h["errors"] == 0 for h in runs)
    assert "DRY RUN" in out.with_suffix(".md").read_text()


def test_gpu_check_refuses_to_run_without_cuda_unless_dry(tiny_bundle, tmp_path):
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA: the real check would run")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.gpu",
            "--bundle",
            str(tiny_bundle),
            "--json",
            str(tmp_path / "gpu.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "onnxruntime-gpu" in done.stderr


def test_profile_summary_splits_busy_time_by_thread_and_package():
    from bench.profile import summarise

    raw = "\n".join(
        [
            "thread (1): MainThread;Runner.run (asyncio/runners.py:118) 60",
            "thread (1): MainThread;send (uvicorn/protocols/http/httptools_impl.py:524) 30",
            "thread (1): MainThread;tokenize (service/runtime.py:138) 10",
            "thread (2): infer-encode;_worker (concurrent/futures/thread.py:81) 50",
            "thread (2): infer-encode;Session.run (onnxruntime/capi/x.py:406) 50",
        ]
    )
    table = summarise(raw, requests=10, seconds=1.0)
    assert "| infer-encode | 50.0 % | 50.00 |" in table
    assert "| MainThread | 40.0 % | 40.00 |" in table
    assert "| uvicorn | 75.0 % |" in table and "| service/runtime.py | 25.0 % |" in table


def test_profile_stages_split_the_client_time_from_the_server_headers():
    from bench.profile import stages

    rows = [
        {
            "client": 3.0 + d,
            "x-tokenization-time": 0.1,
            "x-queue-time": 0.05,
            "x-inference-time": 2.0 + d,
            "x-total-time": 2.6 + d,
        }
        for d in (0.0, 0.1, 0.2)
    ]
    table = stages(rows)
    assert "client-side total 3.100 ms" in table
    assert "| model run (x-inference-time) | 2.100 | 68 % |" in table
    assert "| rest of the app: parse, route, pipeline, respond | 0.450 | 15 % |" in table
    assert "| outside the app: socket, uvicorn, client | 0.400 | 13 % |" in table


def test_framework_bench_answers_every_way_with_200_warm_and_cold():
    import asyncio

    from bench.framework import measure

    rows = asyncio.run(measure(calls=5, sweep_mb=1))  # raises unless every call answered 200
    assert len(rows) == 3
    assert all(v["warm_us"] > 0 and v["cold_us"] > 0 for v in rows.values())


@pytest.mark.slow
def test_hostile_runs_and_reports_every_goal(tiny_bundle, ranker_bundle, tmp_path):
    """bench.hostile end to end on the tiny bundles, small numbers: it must not rot."""
    from bench import hostile

    args = ["--bundle", str(tiny_bundle), "--ranker", str(ranker_bundle), "--idle", "20",
            "--slowloris", "5", "--probes", "10", "--load", "2", "--timeout", "2", "--documents", "64",
            "--out", str(tmp_path)]  # fmt: skip
    assert hostile.main(args) == 0
    out = json.loads((tmp_path / "hostile.json").read_text())
    assert out["sockets"]["health_failed"] == 0 and out["sockets"]["encode_failed"] == 0
    assert out["deadlines"]["requests"] >= 2 and out["gone"]["full_request_cpu_s"] > 0
    assert "< 0.5x" in (tmp_path / "hostile.md").read_text()


@pytest.mark.slow
def test_families_runs_and_reports(tmp_path):
    """bench.families on one family, one layer, few rounds: it must not rot."""
    from bench import families

    args = ["--layers", "1", "--rounds", "2", "--families", "bert", "--root", str(tmp_path / "b"),
            "--out", str(tmp_path)]  # fmt: skip
    assert families.main(args) == 0
    out = json.loads((tmp_path / "families.json").read_text())
    assert out["families"]["bert"]["docs_per_s_128"]["http"] > 0
    assert "| bert | 128 |" in (tmp_path / "families.md").read_text()


def test_profile_under_load_gives_each_threads_cpu_per_request():
    from bench.profile import loaded_table
    from bench.server import stat_cpu_s

    # /proc/<pid>/task/<tid>/stat: the 14th and 15th fields are user and system ticks; the
    # command name may hold spaces and parentheses.
    stat = "42 (python (x) y) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3"
    assert stat_cpu_s(stat, 100) == 3.0
    before = {42: 1.0, 43: 5.0, 44: 0.0}
    after = {42: 3.0, 43: 13.0, 44: 0.001, 45: 7.0}  # 45 started during the run
    table = loaded_table(42, before, after, requests=1000, seconds=10.0, client_s=0.5)
    assert "1000 requests in 10.0 s: 100 a second" in table
    assert "| thread 43 | 80 % | 8.000 |" in table
    assert "| thread 45 | 70 % | 7.000 |" in table
    assert "| event loop (main thread) | 20 % | 2.000 |" in table
    assert "| load generator | 5 % | 0.500 |" in table
    assert "thread 44" not in table  # idle threads are left out
    assert "All together 175 % of a core." in table
    # busiest first
    assert table.index("| thread 43") < table.index("| thread 45") < table.index("| event loop")
