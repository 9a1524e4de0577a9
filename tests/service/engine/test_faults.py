"""Faults at start: a tampered or incomplete bundle refuses to serve; a missing GPU falls back
(or refuses, when the settings demand it)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys

import pytest

from service.bundle import BundleError, load_bundle
from service.engine.runtime import CPU, CUDA, DeviceUnavailable, choose_graph, choose_providers
from service.manifest import FORMAT_VERSION
from service.settings import Settings
from tests.service.conftest import client_for


def serve_once(bundle, *extra, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "serve",
            "--bundle",
            str(bundle),
            "--port",
            "1",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.fixture
def bundle_copy(tiny_bundle, tmp_path):
    dst = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, dst)
    return dst


def test_tampered_graph_refuses_to_start_naming_the_file(bundle_copy):
    graph = bundle_copy / "encoder.onnx"
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0xFF
    graph.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"encoder\.onnx does not match its manifest"):
        load_bundle(bundle_copy)
    done = serve_once(bundle_copy)
    assert done.returncode == 1
    assert "encoder.onnx does not match its manifest" in done.stderr


def test_missing_file_refuses_to_start_naming_it(bundle_copy):
    (bundle_copy / "tokenizer.json").unlink()
    done = serve_once(bundle_copy)
    assert done.returncode == 1 and "tokenizer.json is missing" in done.stderr


def test_missing_manifest_says_how_to_make_one(tmp_path):
    done = serve_once(tmp_path)
    assert done.returncode == 1 and "headwise export" in done.stderr


def test_cuda_demanded_but_absent_refuses_to_start(tiny_bundle):
    if CUDA in __import__("onnxruntime").get_available_providers():
        pytest.skip("this machine has CUDA: the refusal path cannot be shown here")
    done = serve_once(tiny_bundle, "--device", "cuda")
    assert done.returncode == 1 and "HEADWISE_DEVICE=cuda" in done.stderr


def test_providers_prefer_cuda_and_fall_back_to_cpu_with_a_warning(caplog):
    assert choose_providers("auto", [CUDA, CPU]) == [CUDA, CPU]
    assert choose_providers("cuda", [CUDA, CPU]) == [CUDA, CPU]
    assert choose_providers("cpu", [CUDA, CPU]) == [CPU]
    with caplog.at_level(logging.WARNING):
        assert choose_providers("auto", [CPU]) == [CPU]
    assert "CUDA execution provider not available" in caplog.text
    with pytest.raises(DeviceUnavailable, match="onnxruntime-gpu"):
        choose_providers("cuda", [CPU])


def test_graph_choice_follows_device_and_precision(tiny_bundle):
    bundle = load_bundle(tiny_bundle)
    assert choose_graph(bundle, "auto", on_cuda=True) == "encoder_fp16"
    assert choose_graph(bundle, "auto", on_cuda=False) == "encoder"
    assert choose_graph(bundle, "int8", on_cuda=False) == "encoder_int8"


def test_int8_precision_serves_the_quantised_graph(tiny_bundle):
    with client_for(tiny_bundle, precision="int8") as c:
        assert c.get("/info").json()["graph"] == "encoder_int8"
        assert c.post("/encode", json={"inputs": "quantised"}).status_code == 200


def test_settings_come_from_headwise_variables(monkeypatch, tiny_bundle):
    monkeypatch.setenv("HEADWISE_MAX_BATCH_TOKENS", "1234")
    monkeypatch.setenv("HEADWISE_API_KEY", "zq-secret-9")
    s = Settings()
    assert s.max_batch_tokens == 1234 and s.api_key.get_secret_value() == "zq-secret-9"
    assert "zq-secret-9" not in repr(s)


def test_two_bundles_with_one_name_refuse_to_start_naming_both(tiny_bundle):
    done = serve_once(tiny_bundle, "--bundle", str(tiny_bundle))
    assert done.returncode == 1
    assert "two bundles are named 'tiny-random'" in done.stderr and "NAME=DIR" in done.stderr


def test_one_unloadable_bundle_among_several_refuses_to_start_naming_it(tiny_bundle, tmp_path):
    done = serve_once(tiny_bundle, "--bundle", f"other={tmp_path / 'nowhere'}")
    assert done.returncode == 1 and str(tmp_path / "nowhere") in done.stderr


def test_a_bundle_of_another_format_is_refused_naming_both_versions(bundle_copy):
    import json

    path = bundle_copy / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "format": 1}))
    with pytest.raises(BundleError, match=f"format 1.*reads format {FORMAT_VERSION}"):
        load_bundle(bundle_copy)


def test_auto_falls_back_to_the_cpu_and_then_serves_the_fp32_graph(tiny_bundle, monkeypatch, caplog):
    """onnxruntime-gpu lists CUDA even where no driver is: the session then starts on the CPU,
    and the fp16 graph chosen for the GPU is swapped for fp32 (fp16 is slow on a CPU)."""
    import onnxruntime as ort

    from service.engine.runtime import OnnxBackend

    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, CPU])
    with caplog.at_level(logging.WARNING):
        backend = OnnxBackend(load_bundle(tiny_bundle), Settings(device="auto"))
    assert "CUDA provider failed to start" in caplog.text
    assert backend.info.providers == [CPU] and backend.info.graph == "encoder"
    assert backend.inline, "on the CPU after all: small batches may run on the event loop"


def test_cuda_demanded_where_the_provider_cannot_start_refuses_naming_the_driver(
    tiny_bundle, monkeypatch
):
    import onnxruntime as ort

    from service.engine.runtime import OnnxBackend

    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, CPU])
    with pytest.raises(DeviceUnavailable, match="driver"):
        OnnxBackend(load_bundle(tiny_bundle), Settings(device="cuda"))
