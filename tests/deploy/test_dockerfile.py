"""The Dockerfile, read without a Docker engine: hadolint, then what the serving stages must be."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from tests.deploy.conftest import DOCKER, ROOT, free_port, tool

DOCKERFILE = ROOT / "Dockerfile"
SERVING = ("cpu", "gpu")


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str:
        found = self.all(keyword)
        assert found, f"stage {self.name} has no {keyword}"
        return found[-1]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, each with its instructions (continuations joined)."""
    logical, buf = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest.strip(), re.I)
            assert m, line
            base = re.sub(r"\$\{(\w+)\}", lambda v: args.get(v.group(1), v.group(0)), m.group(1))
            stages.append(Stage(m.group(2) or str(len(stages)), base))
        elif not stages:
            assert keyword == "ARG", f"only ARG may come before the first FROM: {line}"
            name, _, default = rest.partition("=")
            args[name] = default
        else:
            stages[-1].instructions.append((keyword, rest.strip()))
    return args, stages


ARGS, STAGES = parse_dockerfile(DOCKERFILE.read_text())
BY_NAME = {s.name: s for s in STAGES}


def copied_from(stage: Stage) -> list[tuple[str, list[str]]]:
    """(source stage, paths) for each COPY --from=."""
    out = []
    for args in stage.all("COPY"):
        words = shlex.split(args)
        frm = [w.split("=", 1)[1] for w in words if w.startswith("--from=")]
        if frm:
            paths = [w for w in words if not w.startswith("--")][:-1]
            out.append((frm[0], paths))
    return out


def lineage(name: str, skip: frozenset[str] = frozenset()) -> list[Stage]:
    """The stage, the stages it is built FROM, and those it copies from (except `skip`)."""
    seen, todo = [], [name]
    while todo:
        stage = BY_NAME.get(todo.pop())
        if stage is None or stage in seen:
            continue
        seen.append(stage)
        todo.append(stage.base)
        todo.extend(src for src, _ in copied_from(stage) if src not in skip)
    return seen


@pytest.mark.parametrize(
    "dockerfile", [DOCKERFILE, DOCKER / "podman" / "prometheus.Containerfile"], ids=lambda p: p.name
)
def test_hadolint_finds_nothing(dockerfile):
    done = subprocess.run(
        [
            tool("hadolint"),
            "--config",
            str(ROOT / ".hadolint.yaml"),
            "--format",
            "json",
            str(dockerfile),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    findings = json.loads(done.stdout or "[]")
    assert findings == [], "\n".join(
        f"{f['line']}: {f['code']} {f['level']}: {f['message']}" for f in findings
    )
    assert done.returncode == 0, done.stderr


def test_hadolint_would_catch_a_problem(tmp_path):
    """The lint is not vacuous: a root final stage with a floating tag is reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install fastapi\nUSER root\n")
    done = subprocess.run(
        [tool("hadolint"), "--config", str(ROOT / ".hadolint.yaml"), "--format", "json", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    codes = {f["code"] for f in json.loads(done.stdout)}
    assert {"DL3007", "DL3002"} <= codes and done.returncode != 0


def test_stages_and_default_target():
    assert STAGES[-1].name == "gpu", "the last stage is what `docker build .` builds"
    assert {"export", "cpu", "gpu"} <= BY_NAME.keys()
    gpu_base = BY_NAME["gpu-base"].base
    assert re.fullmatch(r"nvidia/cuda:1[23]\.\d+\.\d+-cudnn-runtime-ubuntu\d\d\.04", gpu_base), (
        gpu_base
    )
    assert BY_NAME["gpu"].base == "gpu-base"
    for name in ("export", "cpu", "cpu-build"):
        assert BY_NAME[name].base.startswith("python:3.11-slim"), BY_NAME[name].base


def test_export_stage_is_an_image_that_exports_to_a_mounted_folder():
    stage = BY_NAME["export"]
    assert "install.sh export" in " ".join(stage.all("RUN"))
    assert json.loads(stage.last("ENTRYPOINT")) == ["headwise-export"]
    assert json.loads(stage.last("CMD")) == ["--out", "/models/bundle", "--fp16", "--int8"]
    assert stage.last("USER") == "10001:10001"


def test_bundle_stage_exports_the_build_time_model_with_the_export_image():
    stage = BY_NAME["bundle"]
    assert stage.base == "export"
    assert {a.split("=")[0] for a in stage.all("ARG")} == {"MODEL", "REVISION"}
    [run] = stage.all("RUN")
    assert re.search(
        r"MODEL=\$\{MODEL\} REVISION=\$\{REVISION\} headwise-export --out /models/bundle\b", run
    )
    assert "--fp16" in run and "--int8" in run


PIP_ARGS = {
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_TRUSTED_HOST",
    "PIP_FIND_LINKS",
    "PIP_CERT",
}


@pytest.mark.parametrize("name", ["export", "cpu-build", "gpu-build"])
def test_where_packages_come_from_is_a_build_argument(name):
    stage = BY_NAME[name]
    args = {a.split("=")[0] for a in stage.all("ARG")}
    assert args >= PIP_ARGS, f"{name} declares {args}"
    [install] = [r for r in stage.all("RUN") if "install.sh" in r]
    assert "--mount=type=secret,id=pip.conf,target=/etc/pip.conf" in install
    if name == "export":
        assert "TORCH_INDEX_URL" in args and "TORCH_INDEX_URL=${TORCH_INDEX_URL}" in install


@pytest.mark.parametrize("name", SERVING)
def test_serving_stage_has_no_torch(name):
    # The bundle is the only thing taken from the bundle stage, where torch lives.
    stage = BY_NAME[name]
    assert [src for src, _ in copied_from(stage)] == [f"{name}-build", "bundle"]
    from_bundle = [paths for src, paths in copied_from(stage) if src == "bundle"]
    assert from_bundle == [["/models/bundle"]]
    chain = lineage(name, skip=frozenset({"bundle"}))
    runs = [r for s in chain for r in s.all("RUN")]
    assert not any("torch" in r for r in runs), runs
    modes = {m for r in runs for m in re.findall(r"install\.sh (\w+)", r)}
    assert modes == {name}, f"{name} installs with install.sh modes {modes}"


@pytest.mark.parametrize("name", SERVING)
def test_serving_stage_runtime_contract(name):
    stage = BY_NAME[name]
    user = stage.last("USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, (
        f"USER {user}: numeric and not root (runAsNonRoot checks the uid)"
    )
    assert stage.last("EXPOSE") == "8000"
    assert stage.last("STOPSIGNAL") == "SIGTERM"
    assert json.loads(stage.last("ENTRYPOINT")) == ["headwise", "serve"]
    health = stage.last("HEALTHCHECK")
    assert "healthcheck.py" in health and "CMD" in health
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(stage.all("ENV"))))
    assert env["HEADWISE_HOST"] == "0.0.0.0"
    assert env["HEADWISE_BUNDLE"] == "/bundle"
    assert env["HEADWISE_PORT"] == "8000"
    assert env["HEADWISE_DEVICE"] == ("auto" if name == "gpu" else "cpu")
    assert env["PATH"].startswith("/opt/headwise/bin:")
    copies = [shlex.split(c) for c in stage.all("COPY")]
    assert ["docker/healthcheck.py", "/opt/headwise/healthcheck.py"] in copies


def test_healthcheck_script_probes_health():
    text = (DOCKER / "healthcheck.py").read_text()
    assert "/health" in text and "urllib.request" in text


@pytest.mark.slow
def test_healthcheck_script_against_a_real_server(live_server):
    script = str(DOCKER / "healthcheck.py")
    up = subprocess.run(
        [sys.executable, script],
        env={"HEADWISE_PORT": str(live_server.port)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert up.returncode == 0, up.stderr
    down = subprocess.run(
        [sys.executable, script],
        env={"HEADWISE_PORT": str(free_port())},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert down.returncode == 1 and "unhealthy" in down.stderr


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent folders decides."""

    def regex(pattern: str) -> re.Pattern:
        out = ""
        for part in re.split(r"(\*\*/|\*\*|\*|\?|\[[^\]]*\])", pattern.strip("/")):
            out += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
                part, part if part.startswith("[") and len(part) > 1 else re.escape(part)
            )
        return re.compile(out + r"\Z")

    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        rx = regex(pattern[1:] if negate else pattern)
        if any(rx.match(p) for p in prefixes):
            excluded = not negate
    return excluded


def test_dockerignore_keeps_what_copy_needs_and_nothing_else():
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    needed = set()
    for stage in STAGES:
        for args in stage.all("COPY"):
            words = [w for w in shlex.split(args) if not w.startswith("--")]
            if "--from=" not in args:
                needed.update(w.rstrip("/") for w in words[:-1])
    assert needed >= {
        "pyproject.toml",
        "README.md",
        "service",
        "models",
        "export",
        "docker/install.sh",
    }
    for source in sorted(needed):
        path = ROOT / source
        files = [p for p in path.rglob("*.py")] if path.is_dir() else [path]
        assert files, source
        for f in files:
            rel = f.relative_to(ROOT).as_posix()
            assert not dockerignore_excludes(rel, patterns), f"{rel} is needed by COPY but ignored"
    for rel in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/conftest.py",
        "bundles/default/encoder.onnx",
        "service/__pycache__/app.cpython-311.pyc",
        "docker/k8s/deployment.yaml",
    ):
        assert dockerignore_excludes(rel, patterns), f"{rel} would be sent to the daemon"
