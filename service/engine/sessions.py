"""Building an ONNX Runtime session: one place for the options export, service and bench use."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort

from service.engine.cpu import threads_for

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def build_session(
    path: Path | str | bytes,
    providers: list[str] | None = None,
    threads: int = 0,
    spin: bool = False,
    arena: bool = True,
    prepack: bool = True,
) -> ort.InferenceSession:
    """A sequential session with full graph optimisation.

    spin: let intra-op threads spin between the ops of a run (lower latency; only one session
    in a process should, several spinning at once fight for the cores: measured ~5x slower).
    arena: ONNX Runtime's CPU memory arena (fast, but keeps the largest shape it has seen).
    prepack: copy MatMul weights into the GEMM's packed layout (faster). Without it a graph's
    external weights are read where ONNX Runtime maps them from their data file, never copied:
    export's parity runs of a large graph use that.
    """
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads_for(threads)
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.enable_cpu_mem_arena = arena
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    # Spinning past the end of a run steals the core the HTTP side needs next: spin between
    # the ops of a run, stop when it returns (measured: best of both).
    opts.add_session_config_entry("session.force_spinning_stop", "1")
    if not prepack:
        opts.add_session_config_entry("session.disable_prepacking", "1")
    opts.log_severity_level = 3
    model = path if isinstance(path, bytes) else str(path)
    return ort.InferenceSession(model, opts, providers=providers or [CPU])


def run_options(memory: str) -> ort.RunOptions | None:
    """Per-run options for a memory configuration: "shrink" hands the arena's unused regions
    back at the end of every run; "arena" and "off" need none."""
    if memory != "shrink":
        return None
    opts = ort.RunOptions()
    opts.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return opts
