"""Build the images with podman and check them as an operator would (`make image-test`).

    python -m tests.deploy.images cpu        # CI: build export + cpu, run cpu, check it
    python -m tests.deploy.images export     # the export image on a mounted folder -> a volume
    python -m tests.deploy.images gpu        # the gpu target on the stand-in base, no GPU
    python -m tests.deploy.images compose    # docker/compose.yaml under podman-compose

Base images cannot be pulled here: `docker/podman/base.sh` builds a stand-in for
python:3.11-slim from Debian's packages, passed as PYTHON_IMAGE (and as CUDA_IMAGE for `gpu`).
pip inside the builds uses this machine's pip configuration, mounted read-only (podman.py).
Every container is removed on the way out, failed or not; ports are published on 127.0.0.1 only;
every wait has a deadline. The timings are printed at the end.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

from tests.deploy.podman import (
    BASE,
    IMAGE,
    TIMINGS,
    CheckFailed,
    Container,
    base_image,
    build,
    check,
    http,
    image_size_mb,
    podman,
    run_container,
    timed,
    wait_ready,
    wait_until,
)

UID = "10001"
MIN_COSINE = 0.9999
TEXTS = [
    "A man is eating food.",
    "The new movie is awesome, I loved every minute of it!",
    "Le chat dort sur le canapé depuis ce matin.",
    "量子コンピュータは従来のコンピュータとは異なる原理で動作する。",
    "",
    "Transformers use self-attention to relate every token to every other token. " * 30,
]


def reference_embeddings(texts: list[str]) -> np.ndarray:
    """sentence-transformers' own all-MiniLM-L6-v2 pipeline: the independent reference."""
    from sentence_transformers import SentenceTransformer

    from models.weights import default_model_dir

    model = SentenceTransformer(str(default_model_dir()), device="cpu")
    return model.encode(texts, convert_to_numpy=True, normalize_embeddings=True)


def check_embeddings(box: Container) -> None:
    status, body = http("POST", f"{box.url}/encode", {"inputs": TEXTS})
    check(status == 200, f"/encode answers 200 (got {status}{'' if status == 200 else body[:300]})")
    got = np.asarray(json.loads(body)["embeddings"], dtype=np.float64)
    got /= np.linalg.norm(got, axis=-1, keepdims=True)
    cosine = (got * reference_embeddings(TEXTS)).sum(-1)
    check(
        cosine.min() >= MIN_COSINE,
        f"/encode equals sentence-transformers: min cosine {cosine.min():.6f}",
    )


def check_no_torch(image: str) -> None:
    done = podman(
        "run",
        "--rm",
        "--entrypoint",
        "python",
        image,
        "-c",
        "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is not None)",
        check_rc=False,
    )
    check(done.returncode == 0, f"no torch in {image}")


def check_cpu_quota(image: str) -> None:
    """`--cpus 1` (a CPU quota, as Kubernetes' limits.cpu sets): the runtimes run one thread,
    not one per core of the machine (service/engine/cpu.py reads the container's cgroup)."""
    if (os.cpu_count() or 1) < 2:
        print("  --  CPU quota not checked: a 1-CPU machine has nothing to restrict")
        return
    code = (
        "from service.engine.cpu import cores, threads_for; "
        "print(cores().usable, threads_for(0))"
    )
    done = podman("run", "--rm", "--cpus", "1", "--entrypoint", "python", image, "-c", code,
                  check_rc=False)  # fmt: skip
    got = done.stdout.split()
    if done.returncode != 0 and not got and re.search(r"^Error: ", done.stderr, re.M):  # podman's
        print(f"  --  CPU quota not checked: podman could not set one here ({done.stderr[-200:]})")
        return
    ok = done.returncode == 0 and got == ["1", "1"]
    why = "" if ok else f" (got {got}: {done.stderr[-300:]})"
    check(ok, f"--cpus 1: 1 usable CPU and 1 ONNX Runtime thread{why}")


def check_workers(image: str) -> None:
    """HEADWISE_WORKERS=2 in the container: two server processes answer on the one port, and
    `podman stop` (SIGTERM to the supervisor, PID 1) drains both and exits 0."""
    with run_container(image, "-e", "HEADWISE_WORKERS=2") as box:
        wait_ready(box)
        pids: set[int] = set()

        def both() -> bool:
            status, body = http("GET", f"{box.url}/info", timeout=10)
            if status == 200:
                pids.add(json.loads(body)["workers"]["pid"])
            return len(pids) == 2

        wait_until("two workers answering /info", both, 120)
        status, _ = http("POST", f"{box.url}/encode", {"inputs": "hello"}, timeout=60)
        check(status == 200 and len(pids) == 2, f"HEADWISE_WORKERS=2: pids {sorted(pids)} answer")
        stop = podman("stop", "--time", "45", box.name, check_rc=False, timeout=90)
        code = box.inspect("{{.State.ExitCode}}")
        check(stop.returncode == 0 and code == "0", f"both workers drained, exit 0 (got {code})")


# ---- item 1: the cpu image --------------------------------------------------------------------


def check_cpu_image(image: str) -> None:
    check_no_torch(image)
    check_cpu_quota(image)
    check_workers(image)
    with run_container(image) as box:
        wait_ready(box)
        check(box.inspect("{{.Config.User}}") == f"{UID}:{UID}", f"runs as {UID}")
        uid = podman("exec", box.name, "python", "-c", "import os; print(os.getuid())").stdout
        check(uid.strip() == UID, f"the server's process has uid {UID}")
        check(
            box.inspect("{{.HostConfig.ReadonlyRootfs}}") == "true", "root filesystem is read-only"
        )
        write = podman(
            "exec", box.name, "python", "-c", "open('/opt/headwise/x', 'w')", check_rc=False
        )
        check(
            write.returncode != 0 and "Read-only file system" in write.stderr,
            "writing to the root filesystem fails",
        )
        check_embeddings(box)
        rpc = podman("exec", box.name, "python", "-c", "import service.rpc.server", check_rc=False)
        check(rpc.returncode == 0, f"gRPC is in the image (service.rpc.server imports) {rpc.stderr}")
        health = podman("healthcheck", "run", box.name, check_rc=False)
        status = box.inspect("{{.State.Healthcheck.Status}}")
        check(
            health.returncode == 0 and status == "healthy",
            f"podman healthcheck run: {status} {health.stdout.strip()}",
        )
        with timed("podman stop during requests"):
            check_stop_drains(box)


def metric(box: Container, name: str) -> float:
    status, body = http("GET", f"{box.url}/metrics", timeout=5)
    found = re.search(rf"^{name} (\S+)$", body.decode(), re.M) if status == 200 else None
    return float(found.group(1)) if found else 0.0


def check_stop_drains(box: Container, clients: int = 8) -> None:
    """SIGTERM (podman stop) while requests are in flight: all of them answered, exit code 0."""
    texts = [
        f"request text {i}: " + "every token attends to every other token " * 12 for i in range(24)
    ]

    def request(i: int) -> tuple[int, float]:
        status, _ = http("POST", f"{box.url}/encode", {"inputs": texts}, timeout=120)
        return status, time.monotonic()

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(request, i) for i in range(clients)]
        # In flight: every client's request is being handled (the metrics request adds one).
        wait_until(
            "requests in flight",
            lambda: (
                metric(box, "headwise_inflight_requests") >= clients
                or any(f.done() for f in futures)
            ),
            60,
        )
        stopped_at = time.monotonic()
        stop = podman("stop", "--time", "45", box.name, check_rc=False, timeout=90)
        results = [f.result(timeout=120) for f in futures]
    statuses = [s for s, _ in results]
    check(statuses == [200] * clients, f"every request in flight answered 200: {statuses}")
    after = sum(t > stopped_at for _, t in results)
    check(after > 0, f"{after} of {clients} answered after SIGTERM (the drain was exercised)")
    check(stop.returncode == 0, "podman stop exited 0")
    code = box.inspect("{{.State.ExitCode}}")
    check(code == "0", f"the server exited with 0 after the drain (got {code})")


def cpu(_: argparse.Namespace) -> None:
    base_image()
    build("export")
    image = build("cpu")
    check_cpu_image(image)
    print(
        f"image sizes: export {image_size_mb(f'{IMAGE}:export'):.0f} MB, "
        f"cpu {image_size_mb(image):.0f} MB"
    )


# ---- item 3 and the deploy-time model: export into a volume, serve the volume -------------------


def export(args: argparse.Namespace) -> None:
    from models.weights import default_model_dir

    base_image()
    build("export")
    cpu_image = build("cpu")
    volume = f"headwise-check-{uuid.uuid4().hex[:8]}"
    podman("volume", "create", volume)
    try:
        # The default model's files as "a model folder of your own", mounted read-only.
        folder = Path(args.model_dir or default_model_dir())
        mounts = ["-v", f"{folder}:/model:ro", "-v", f"{volume}:/models", "-e", "MODEL=/model"]
        with (
            timed("export image: mounted folder -> volume"),
            run_container(f"{IMAGE}:export", *mounts, serve=False) as box,
        ):
            wait_until("export", lambda: not box.running(), 900)
            code = box.inspect("{{.State.ExitCode}}")
            if code != "0":
                print(box.logs(), file=sys.stderr)
            check(code == "0", f"the export image exited 0 (got {code})")
        with run_container(
            cpu_image, "-v", f"{volume}:/models:ro", "-e", "HEADWISE_BUNDLE=/models/bundle"
        ) as box:
            wait_ready(box)
            status, body = http("GET", f"{box.url}/info")
            model = json.loads(body)["model"] if status == 200 else None
            check(model == "model", f"it serves the volume's bundle, not the baked one: {model}")
            check_embeddings(box)
    finally:
        podman("volume", "rm", "--force", volume, check_rc=False)


# ---- item 4: the gpu target without a GPU -------------------------------------------------------


def gpu(args: argparse.Namespace) -> None:
    base_image()
    extras = [f"--build-arg=ORT_GPU_EXTRAS={args.ort_extras}"] if args.ort_extras else []
    image = build("gpu", f"--build-arg=CUDA_IMAGE={BASE}", *extras)
    check_no_torch(image)
    print(f"image size: gpu {image_size_mb(image):.0f} MB")
    # onnxruntime-gpu lists the CUDA provider whether or not CUDA can load, so the refusal comes
    # when the session is created, at startup: a non-zero exit, and never ready.
    with run_container(image, "-e", "HEADWISE_DEVICE=cuda", serve=False) as box:
        wait_until("HEADWISE_DEVICE=cuda exits", lambda: not box.running(), 120)
        log = box.logs()
        code = box.inspect("{{.State.ExitCode}}")
        refusal = [
            ln for ln in log.splitlines() if "DeviceUnavailable" in ln or "cannot serve" in ln
        ]
        if args.ort_extras:
            # The CUDA libraries from pip all load; what is missing is the driver's libcuda.
            loading = [
                ln.rsplit("with error: ", 1)[-1]
                for ln in log.splitlines()
                if "Failed to load library" in ln
            ]
            check(
                bool(loading) and all("libcuda.so" in ln for ln in loading),
                f"with the pip CUDA libraries only the driver is missing: {loading}",
            )
        check(
            code != "0" and bool(refusal),
            f"HEADWISE_DEVICE=cuda refuses to start (exit {code}): {refusal}",
        )
    with run_container(image) as box:
        wait_ready(box)
        log = box.logs()
        check(
            "serving on the CPU" in log,
            f"HEADWISE_DEVICE=auto falls back with a warning: "
            f"{[ln for ln in log.splitlines() if 'WARNING' in ln]}",
        )
        check_embeddings(box)


# ---- item 5: compose ------------------------------------------------------------------------------


def compose(_: argparse.Namespace) -> None:
    from tests.deploy import compose_run

    base_image()
    compose_run.run()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("what", choices=["cpu", "export", "gpu", "compose"])
    p.add_argument(
        "--model-dir", help="export: the model folder to mount (default: the default model's)"
    )
    p.add_argument(
        "--ort-extras", default="", help='gpu: onnxruntime-gpu extras, e.g. "cuda,cudnn"'
    )
    args = p.parse_args()
    started = time.monotonic()
    failed = None
    try:
        {"cpu": cpu, "export": export, "gpu": gpu, "compose": compose}[args.what](args)
    except (CheckFailed, subprocess.TimeoutExpired) as exc:
        failed = exc
    print("\ntimings:")
    for step, seconds in TIMINGS:
        print(f"  {seconds:7.1f} s  {step}")
    print(f"  {time.monotonic() - started:7.1f} s  total ({args.what})")
    if failed is not None:
        print(f"\nFAILED: {failed}", file=sys.stderr)
        return 1
    print(f"\nimage checks ({args.what}): all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
