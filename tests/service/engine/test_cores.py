"""The CPUs this process may use: affinity, capped by the container's CPU quota (cgroup v2, v1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from service.engine.cpu import cores, quota_cpus


@pytest.fixture
def sixteen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)


def v2(tmp_path: Path, text: str) -> list[Path]:
    (tmp_path / "cpu.max").write_text(text + "\n")
    return [tmp_path / "cpu.max"]


def v1(tmp_path: Path, quota: str, period: str = "100000") -> list[Path]:
    (tmp_path / "cpu.cfs_quota_us").write_text(quota + "\n")
    (tmp_path / "cpu.cfs_period_us").write_text(period + "\n")
    return [tmp_path / "cpu.max", tmp_path / "cpu.cfs_quota_us"]  # v2's file absent: v1 read


@pytest.mark.parametrize(
    ("text", "want"),
    [("400000 100000", 4), ("250000 100000", 2), ("50000 100000", 1), ("max 100000", None)],
)
def test_cgroup_v2_quota_in_whole_cpus_rounded_down(
    tmp_path: Path, text: str, want: int | None
) -> None:
    assert quota_cpus(v2(tmp_path, text))[0] == want


def test_cgroup_v1_quota_over_its_period(tmp_path: Path) -> None:
    assert quota_cpus(v1(tmp_path, "300000"))[0] == 3
    assert quota_cpus(v1(tmp_path, "-1"))[0] is None


def test_no_cgroup_files_is_no_quota(tmp_path: Path) -> None:
    assert quota_cpus([tmp_path / "cpu.max"]) == (None, "no readable CPU quota")


def test_a_quota_below_the_affinity_sets_the_count(tmp_path: Path, sixteen: None) -> None:
    c = cores(v2(tmp_path, "400000 100000"))
    assert (c.usable, c.machine, c.restricted) == (4, 16, True)
    assert "CPU quota" in c.why and "4 of 16" in c.why


def test_affinity_below_the_quota_sets_the_count(
    tmp_path: Path, sixteen: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    c = cores(v2(tmp_path, "800000 100000"))
    assert (c.usable, c.restricted) == (2, True)
    assert "affinity" in c.why


def test_a_free_process_uses_every_cpu(tmp_path: Path, sixteen: None) -> None:
    c = cores(v2(tmp_path, "max 100000"))
    assert (c.usable, c.restricted) == (16, False)


def test_openvino_streams_by_usable_cpus() -> None:
    from service.engine.cpu import auto_streams

    assert [auto_streams(n) for n in (1, 2, 8, 15, 16, 64)] == [1, 1, 1, 1, 2, 2]
    # On AMX (2 cores: 1.09-1.24x the texts/s at 0.99x one text's p50, with the lone compile).
    amx = frozenset({"amx_bf16", "avx512_bf16"})
    assert [auto_streams(n, amx) for n in (1, 2, 8, 15, 16)] == [1, 2, 2, 2, 2]
    assert auto_streams(8, frozenset({"avx512_bf16"})) == 1  # bf16 without AMX: not measured
