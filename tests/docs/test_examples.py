"""Every example of the README and the manual runs (`make docs-test`; `make test` runs it too).

Each fenced `python`, `sh` or `bash` block is executed against a real `headwise serve` process
with the default embedder (all-MiniLM-L6-v2), a reranker and a classifier (random weights),
gRPC on: `127.0.0.1:8000` (or `localhost:8000`) in a block is that server's HTTP address and
`127.0.0.1:8001` its gRPC one; `127.0.0.1:8002` is a second server with a CLIP model named `clip`
(random weights: the image examples'). Python blocks run in a fresh interpreter of this venv (their
asserts are the answers they expect); shell blocks under `bash -euo pipefail`, with `curl`
failing on any HTTP error (a wrong field is a 422: the example breaks), unless the block is marked
as one that shows an error. A block that cannot run here says why, in a comment on the line
before its fence, and is skipped with that reason:

    <!-- docs-test: skip "needs a GPU" -->
    <!-- docs-test: shows an error -->
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pytest

from bench.server import free_port
from tests.live import serve
from tests.service.api.test_oip import classifier  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUN = {"python", "sh", "bash"}
FENCE = re.compile(r"^```(\w*)\s*$")
SKIP = re.compile(r'^<!-- docs-test: skip "(.+)" -->$')
SHOWS_ERROR = "<!-- docs-test: shows an error -->"


@dataclass(frozen=True)
class Example:
    page: Path
    line: int
    lang: str
    code: str
    marker: str  # the line before the fence ("" when none)

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def skip(self) -> str | None:
        found = SKIP.match(self.marker)
        return found.group(1) if found else None


def examples() -> list[Example]:
    out = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            opened = FENCE.match(lines[i])
            if opened is None:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            before = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            if opened.group(1) in RUN:
                code = "\n".join(lines[i + 1 : end]) + "\n"
                out.append(Example(page, i + 1, opened.group(1), code, before))
            i = end + 1
    return out


EXAMPLES = examples()


def test_the_manual_has_examples_and_every_marker_is_understood():
    assert len(EXAMPLES) >= 20
    for e in EXAMPLES:
        if e.marker.startswith("<!-- docs-test"):
            assert e.skip is not None or e.marker == SHOWS_ERROR, (e.id, e.marker)


@pytest.fixture(scope="module")
def server(default_bundle, ranker_bundle, classifier, clip_bundle, tmp_path_factory):  # noqa: F811
    grpc_port = free_port()
    specs = [str(default_bundle), f"ranker={ranker_bundle}", f"nli={classifier}"]
    env = {"HEADWISE_GRPC_PORT": str(grpc_port)}
    tmp = tmp_path_factory.mktemp("docs")
    with (
        serve(specs, tmp, env=env, ready_s=120) as live,
        serve([f"clip={clip_bundle}"], tmp, ready_s=120) as images,
    ):
        yield live, grpc_port, images


@pytest.fixture(scope="module")
def offline(tmp_path_factory) -> dict[str, str]:
    """What any offline machine sets for these clients: tiktoken's cl100k_base file in its
    cache (LangChain), litellm's price list from its package. (Not HF_HUB_OFFLINE:
    huggingface_hub then refuses every URL, a local server's too.)"""
    cache = tmp_path_factory.mktemp("tiktoken")
    src = resources.files("tiktoken_ext").joinpath("data/cl100k_base.tiktoken")
    url = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
    shutil.copy(str(src), cache / hashlib.sha1(url.encode()).hexdigest())
    return {
        "TIKTOKEN_CACHE_DIR": str(cache),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }


def run(example: Example, server, offline, tmp_path) -> subprocess.CompletedProcess:
    live, grpc_port, images = server
    address = live.url.removeprefix("http://")
    code = (
        example.code.replace("127.0.0.1:8000", address)
        .replace("localhost:8000", address)
        .replace("127.0.0.1:8001", f"127.0.0.1:{grpc_port}")
        .replace("127.0.0.1:8002", images.url.removeprefix("http://"))
    )
    env = {**os.environ, **offline, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    if example.lang == "python":
        argv = [sys.executable, "-c", code]
    else:
        fail = "" if example.marker == SHOWS_ERROR else "--fail-with-body "
        preamble = f'curl() {{ command curl {fail}"$@"; }}\n'
        argv = ["bash", "-euo", "pipefail", "-c", preamble + code]
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.id)
def test_example_runs(example: Example, server, offline, tmp_path):
    if example.skip is not None:
        pytest.skip(example.skip)
    done = run(example, server, offline, tmp_path)
    assert done.returncode == 0, (
        f"{example.id} failed:\n{example.code}\n--- stdout\n{done.stdout[-2000:]}\n"
        f"--- stderr\n{done.stderr[-3000:]}"
    )


@pytest.mark.parametrize(
    ("lang", "code"),
    [
        ("sh", "curl -s localhost:8000/encode -H 'content-type: application/json' -d '{\"input\": [\"a\"]}'\n"),
        ("sh", "curl -s localhost:8000/encodes -H 'content-type: application/json' -d '{\"inputs\": [\"a\"]}'\n"),
        ("python", "import httpx\nr = httpx.post('http://127.0.0.1:8000/encode', json={'inputs': ['a']}).json()\nassert r['dimensions'] == 768\n"),
    ],
    ids=["a wrong field", "a wrong path", "a changed answer"],
)
def test_a_broken_example_fails(lang, code, server, offline, tmp_path):
    broken = Example(ROOT / "README.md", 0, lang, code, "")
    assert run(broken, server, offline, tmp_path).returncode != 0
