"""Runtimes' thread counts: one per CPU the process may use (affinity, CPU quota), not per core of
the machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from service.engine import cpu, sessions
from service.engine.openvino_session import OpenVinoSession, available


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    path = tmp_path_factory.mktemp("g") / "relu.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture(autouse=True)
def no_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "CGROUP_CPU", ())  # this machine's own cgroup out of the figures


def threads_of(path: Path, threads: int = 0) -> int:
    s = sessions.build_session(path, threads=threads)
    return s.get_session_options().intra_op_num_threads


def test_a_free_process_keeps_onnx_runtimes_own_count(graph: Path, monkeypatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert threads_of(graph) == 0


def test_a_pinned_process_gets_one_thread_per_cpu_it_may_use(graph: Path, monkeypatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 7})
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert threads_of(graph) == 2
    assert threads_of(graph, threads=5) == 5  # an operator's count stands


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2, reason="Linux, 2+ CPUs"
)
def test_taskset_to_one_cpu_gives_one_thread(graph: Path) -> None:
    """The real affinity call, in a process pinned to one CPU (what taskset -c 0 does)."""
    code = (
        "import os, sys; from service.engine.sessions import build_session;"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
        "print(build_session(sys.argv[1]).get_session_options().intra_op_num_threads)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(graph)], capture_output=True, text=True, check=True
    )
    assert int(out.stdout) == 1


def test_a_container_quota_sets_onnx_runtimes_threads(
    graph: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A 4-CPU pod on a 16-core node (Kubernetes' limits.cpu: 4 writes cpu.max)."""
    (tmp_path / "cpu.max").write_text("400000 100000\n")
    monkeypatch.setattr(cpu, "CGROUP_CPU", (tmp_path / "cpu.max",))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert threads_of(graph) == 4


@pytest.mark.skipif(available() is None, reason="OpenVINO is not installed")
def test_openvino_compiles_with_one_thread_per_cpu_the_quota_allows(
    graph: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = len(os.sched_getaffinity(0))  # OpenVINO caps a count at the CPUs it can use
    (tmp_path / "cpu.max").write_text("100000 100000\n")  # one CPU's time
    monkeypatch.setattr(cpu, "CGROUP_CPU", (tmp_path / "cpu.max",))
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    session = OpenVinoSession(graph)
    assert int(session.compiled.get_property("INFERENCE_NUM_THREADS")) == 1
    explicit = OpenVinoSession(graph, threads=2).compiled  # an operator's count stands
    assert int(explicit.get_property("INFERENCE_NUM_THREADS")) == min(2, real)
