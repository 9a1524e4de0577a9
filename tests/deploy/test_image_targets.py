"""The make targets that build and run the images with podman (tests/deploy/images.py), read
without running them: they exist as the README names them, and podman is set up the way these
hosts need. `make image-test` runs them for real."""

from __future__ import annotations

import re
import subprocess
import tomllib

import pytest

from tests.deploy.conftest import DOCKER, ROOT

MAKEFILE = (ROOT / "Makefile").read_text()
DEPLOY = (ROOT / "docs" / "deploy.md").read_text()  # the manual's Deploy page


def recipe(target: str) -> str:
    match = re.search(rf"^{target}:[^\n]*\n((?:\t[^\n]*\n)+)", MAKEFILE, re.M)
    assert match, f"no target {target} in the Makefile"
    return match.group(1)


@pytest.mark.parametrize(
    ("target", "what"),
    [
        ("image-test", "cpu"),
        ("image-test-export", "export"),
        ("image-test-gpu", "gpu"),
        ("compose-test", "compose"),
    ],
)
def test_each_target_runs_its_check_after_installing_the_tools(target, what):
    assert re.search(rf"^{target}: .*\bimage-deps\b", MAKEFILE, re.M)
    assert f"-m tests.deploy.images {what}\n" in recipe(target)
    assert f"make {target}" in DEPLOY


def test_image_deps_installs_podman_and_runc_only_when_missing():
    deps = re.search(r"^IMAGE_PACKAGES := (.*)$", MAKEFILE, re.M).group(1).split()
    assert {"podman", "buildah", "runc", "debootstrap"} <= set(deps)
    body = recipe("image-deps")
    assert "dpkg -s" in body and "apt-get install" in body


def test_podman_uses_runc_cgroupfs_and_no_default_ulimits():
    conf = tomllib.loads((DOCKER / "podman" / "containers.conf").read_text())
    assert conf["containers"]["default_ulimits"] == []
    assert conf["engine"]["cgroup_manager"] == "cgroupfs"
    assert conf["engine"]["runtime"] == "runc"
    runner = (ROOT / "tests" / "deploy" / "podman.py").read_text()
    assert "CONTAINERS_CONF" in runner and "containers.conf" in runner


def test_base_script_is_valid_bash_and_keeps_an_existing_base():
    script = DOCKER / "podman" / "base.sh"
    assert subprocess.run(["bash", "-n", str(script)], timeout=30).returncode == 0
    text = script.read_text()
    assert "podman image exists" in text and "--variant=minbase" in text
