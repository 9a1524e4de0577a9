"""The memory bound knows each model's real size (its graphs' bytes, external data included)
and must fit the memory the server may use: HEADWISE_MEMORY_LIMIT_BYTES, else the container's
cgroup limit. Two models that do not fit stop the start, naming the one that does not and by
how much; the check reads the manifests before any graph is loaded.

On fake backends and manifests: no graph, no torch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from service import registry
from service.engine.cpu import Cores
from service.engine.memory import (
    MemoryBoundError,
    ModelCost,
    check_fit,
    memory_limit,
)
from service.manifest import DataFile
from service.metrics import Metrics
from service.registry import ModelSpec, Registry, stream_room
from service.settings import Settings
from tests.service.conftest import client_for
from tests.service.fakes import FakeBackend, fake_loader, fake_manifest

GiB = 2**30


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """The bound's base is the process's resident memory: a fresh server's (~0.3 GiB), not this
    suite's, which grows past 2 GiB by its end and would move every figure below."""
    monkeypatch.setattr(registry, "rss_bytes", lambda: int(0.3 * GiB))


def big_manifest(name: str, gib: float, task: str = "embed"):
    """A fake manifest whose serving graph keeps `gib` GiB of weights in a data file."""
    manifest = fake_manifest(name, task=task)
    graph = manifest.graphs["encoder"]
    data = DataFile(file="encoder.onnx.data", sha256="0" * 64, bytes=int(gib * GiB))
    heavy = graph.model_copy(update={"bytes": 10_000, "data": [data]})
    return manifest.model_copy(update={"graphs": {"encoder": heavy, "attention": heavy}})


def test_the_limit_is_the_setting_else_the_cgroups_else_none(tmp_path):
    assert memory_limit(5 * GiB) == (5 * GiB, "HEADWISE_MEMORY_LIMIT_BYTES")
    assert memory_limit(0)[0] == 0
    v2 = tmp_path / "memory.max"
    v2.write_text("4294967296\n")
    limit, source = memory_limit(None, [v2])
    assert limit == 4 * GiB and str(v2) in source
    v2.write_text("max\n")
    assert memory_limit(None, [v2])[0] == 0
    v1 = tmp_path / "memory.limit_in_bytes"
    v1.write_text("9223372036854771712\n")  # cgroup v1's "unlimited"
    assert memory_limit(None, [tmp_path / "absent", v1])[0] == 0


def test_the_model_that_passes_the_limit_is_named_with_the_excess():
    costs = [ModelCost("a", 3 * GiB, GiB), ModelCost("b", 4 * GiB, GiB)]
    check_fit(costs, GiB, 0, 10 * GiB, "test")
    with pytest.raises(MemoryBoundError) as err:
        check_fit(costs, GiB, 0, 8 * GiB, "the test's limit")
    message = str(err.value)
    assert message.startswith("model 'b' does not fit in memory")
    assert "4.00 GiB" in message and "with 'a' (4.00 GiB)" in message
    assert "the bound is 10.00 GiB, 2.00 GiB over the limit of 8.00 GiB (the test's limit)" in message


def test_the_start_fails_naming_the_model_before_loading_any_graph(tmp_path):
    """Bundles on disk: the manifests say what the graphs take; the loader is never called."""
    specs = []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text(big_manifest(name, 3).model_dump_json())
        specs.append(ModelSpec(tmp_path / name))

    def loader(spec, settings):
        raise AssertionError("a graph was loaded before the memory check")

    settings = Settings(memory_limit_bytes=6 * GiB, attention_enabled=False)
    with pytest.raises(MemoryBoundError, match=r"model 'second' does not fit.*over the limit"):
        Registry.load(specs, loader, settings, Metrics())
    settings = Settings(memory_limit_bytes=6 * GiB)  # /attention: a second copy of each
    with pytest.raises(MemoryBoundError, match=r"model 'first' does not fit"):
        Registry.load(specs, loader, settings, Metrics())


def test_models_that_fit_start_and_info_shows_their_size_and_the_limit():
    one, two = (FakeBackend(big_manifest(n, 1.5, "rerank")) for n in ("one", "two"))
    settings = dict(memory_limit_bytes=20 * GiB, attention_enabled=False)
    with client_for(["a", "b"], loader=fake_loader(one, two), **settings) as c:
        memory = c.get("/info").json()["memory"]
        assert memory["models_bytes"] == 2 * (int(1.5 * GiB) + 10_000)
        assert memory["limit_bytes"] == 20 * GiB
        graphs = {m["name"]: m["graph_files"]["encoder"] for m in c.get("/info").json()["models"]}
        assert graphs["one"] == {"fake.onnx": 10_000, "encoder.onnx.data": int(1.5 * GiB)}


def test_loaded_models_without_manifests_on_disk_are_checked_as_loaded():
    one, two = (FakeBackend(big_manifest(n, 5, "rerank")) for n in ("one", "two"))
    with pytest.raises(MemoryBoundError, match="model 'two' does not fit"):
        Registry.load(
            [ModelSpec(Path("a")), ModelSpec(Path("b"))],
            fake_loader(one, two),
            Settings(memory_limit_bytes=8 * GiB, attention_enabled=False),
            Metrics(),
        )


def test_a_second_openvino_stream_is_taken_only_where_the_limit_has_room(tmp_path, monkeypatch):
    """A second stream holds one more batch and the lone compile's copy of the serving graph:
    with 3 GiB of weights a 6 GiB limit fits one stream but not two (the loader is told 1);
    12 GiB, or no limit, leaves them to the CPUs (16 here: 2)."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "manifest.json").write_text(big_manifest("m", 3, "rerank").model_dump_json())
    specs = [ModelSpec(tmp_path / "m")]
    monkeypatch.setattr(registry, "cores", lambda: Cores(16, 16, "as the test says"))
    seen = []

    def loader(spec, settings):
        seen.append(settings.openvino_streams)
        return FakeBackend(big_manifest("m", 3, "rerank"))

    for limit in (6 * GiB, 12 * GiB, 0):
        settings = Settings(memory_limit_bytes=limit, attention_enabled=False)
        assert stream_room(specs, settings, 0, 0, limit) is (limit != 6 * GiB)
        Registry.load(specs, loader, settings, Metrics())
    assert seen == [1, 2, 2]
    pinned = Settings(memory_limit_bytes=6 * GiB, attention_enabled=False, openvino_streams=2)
    Registry.load(specs, loader, pinned, Metrics())  # the operator's figure is kept
    assert seen[-1] == 2
