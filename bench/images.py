"""python -m bench.images: images a second through a CLIP ViT-B/32, three ways, same pictures.

No Hub here: the checkpoint is CLIP ViT-B/32's architecture (transformers' CLIPConfig defaults:
vision 12 layers, d 768, 12 heads, 32-px patches at 224 px; text 12 layers, d 512) with random
weights, saved by transformers and exported by headwise; its speed is the real model's.
The pictures are photographs' sizes (640 x 480 and others), JPEG, synthetic.

1. transformers in-process: CLIPImageProcessorPil then CLIPModel.get_image_features, batches
   of `--batch`, torch on this machine's cores; the preprocessing's share of the time.
2. headwise graph-direct: service/images (decode, EXIF, RGB, resize, crop, normalise) then the
   bundle's fused vision graph on ONNX Runtime, the same batches; the preprocessing's share.
3. headwise over HTTP: a `headwise serve` process, `--clients` clients each sending requests of
   `--batch` images (base64 data URIs) to /encode back to back; images a second, and a single
   image's latency (p50) on the idle server.

Writes bench/results/images.{json,md}.
"""

from __future__ import annotations

import argparse
import base64
import io
import logging
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.results_io import machine, save
from bench.server import launch, stop

log = logging.getLogger("bench.images")
RESULTS = Path("bench/results")
CACHE = Path("bench/.cache")
SIZES = [(640, 480), (480, 640), (800, 600), (1024, 768), (500, 375), (300, 300)]


def photos(count: int, seed: int = 0) -> list[bytes]:
    """JPEGs of photographs' sizes: smooth gradients and shapes with noise (they compress as
    photos do, a few tens of KB)."""
    from PIL import Image, ImageDraw, ImageFilter

    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        w, h = SIZES[i % len(SIZES)]
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (w + h) + 64], -1)
        noisy = np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)
        img = Image.fromarray(noisy, "RGB")
        draw = ImageDraw.Draw(img)
        for _ in range(6):
            x0, y0 = int(rng.integers(0, w - 40)), int(rng.integers(0, h - 40))
            colour = tuple(int(c) for c in rng.integers(0, 256, 3))
            draw.ellipse((x0, y0, x0 + int(rng.integers(20, w // 3)), y0 + int(rng.integers(20, h // 3))), fill=colour)
        buf = io.BytesIO()
        img.filter(ImageFilter.GaussianBlur(1)).save(buf, "JPEG", quality=88)
        out.append(buf.getvalue())
    return out


def checkpoint(folder: Path, tiny: bool = False) -> Path:
    """CLIP ViT-B/32's shape, random weights (std 0.02, as transformers initialises), saved."""
    if (folder / "config.json").exists():
        return folder
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel

    from tests.models.image_checkpoints import write_tokenizer

    if tiny:  # the bench's own test: a small tower, the same code
        cfg = CLIPConfig(
            text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                         "num_attention_heads": 2, "vocab_size": 100, "eos_token_id": 99},
            vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                           "num_attention_heads": 2},
            projection_dim=16,
        )  # fmt: skip
    else:
        cfg = CLIPConfig(text_config={"vocab_size": 100, "eos_token_id": 99})
    model = CLIPModel(cfg).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    write_tokenizer(folder, {"<unk>": 0, "<start>": 1, "<end>": 99}, "<start> $A <end>")
    CLIPImageProcessorPil().save_pretrained(folder)
    return folder


def export(folder: Path, bundle: Path) -> Path:
    if not (bundle / "manifest.json").exists():
        from export.cli import main

        if main(["--model", str(folder), "--out", str(bundle)]) != 0:
            raise SystemExit("export failed")
    return bundle


def cpu_name() -> str:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "unknown")


def batches(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def transformers_side(folder: Path, data: list[bytes], batch: int) -> dict[str, float]:
    import torch
    from PIL import Image
    from transformers import CLIPImageProcessorPil, CLIPModel

    model = CLIPModel.from_pretrained(folder).eval()
    processor = CLIPImageProcessorPil.from_pretrained(folder)
    prep = infer = 0.0
    with torch.inference_mode():
        model.get_image_features(pixel_values=torch.zeros(1, 3, 224, 224))  # warm
        for part in batches(data, batch):
            t0 = time.perf_counter()
            images = [Image.open(io.BytesIO(d)).convert("RGB") for d in part]
            pixels = processor(images=images, return_tensors="pt")["pixel_values"]
            t1 = time.perf_counter()
            model.get_image_features(pixel_values=pixels)
            t2 = time.perf_counter()
            prep, infer = prep + t1 - t0, infer + t2 - t1
    total = prep + infer
    return {"images_per_s": len(data) / total, "preprocessing_share": prep / total,
            "preprocess_ms_per_image": prep / len(data) * 1e3, "torch_threads": torch.get_num_threads()}  # fmt: skip


def graph_side(bundle: Path, data: list[bytes], batch: int) -> dict[str, float]:
    from service.bundle import load_bundle
    from service.engine.sessions import build_session
    from service.images import ImageLimits, decode, preprocess

    b = load_bundle(bundle)
    assert b.manifest.vision is not None
    p = b.manifest.vision.preprocessing
    session = build_session(b.vision_path("encoder"))
    limits = ImageLimits()
    session.run(None, {"pixel_values": np.zeros((1, 3, 224, 224), np.float32)})  # warm
    prep = infer = 0.0
    for part in batches(data, batch):
        t0 = time.perf_counter()
        pixels = np.stack([preprocess(decode(d, limits), p) for d in part])
        t1 = time.perf_counter()
        session.run(None, {"pixel_values": pixels})
        t2 = time.perf_counter()
        prep, infer = prep + t1 - t0, infer + t2 - t1
    total = prep + infer
    return {"images_per_s": len(data) / total, "preprocessing_share": prep / total,
            "preprocess_ms_per_image": prep / len(data) * 1e3}  # fmt: skip


def http_side(bundle: Path, data: list[bytes], batch: int, clients: int) -> dict[str, float]:
    refs = ["data:image/jpeg;base64," + base64.b64encode(d).decode() for d in data]
    requests = batches(refs, batch)
    proc, url = launch(bundle, env={"HEADWISE_MAX_BODY_BYTES": str(64 * 2**20)})
    try:
        with httpx.Client(timeout=120) as c:
            single = []
            for ref in refs[:9]:
                t0 = time.perf_counter()
                r = c.post(f"{url}/encode", json={"images": [ref]})
                single.append(time.perf_counter() - t0)
                r.raise_for_status()
        todo = list(range(len(requests)))
        lock, failures = threading.Lock(), []

        def client() -> None:
            with httpx.Client(timeout=300) as c:
                while True:
                    with lock:
                        if not todo:
                            return
                        i = todo.pop()
                    r = c.post(f"{url}/encode", json={"images": requests[i]})
                    if r.status_code != 200:
                        failures.append(r.status_code)

        threads = [threading.Thread(target=client) for _ in range(clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - t0
    finally:
        stop(proc)
    if failures:
        raise RuntimeError(f"HTTP failures: {failures[:5]}")
    return {"images_per_s": len(data) / seconds, "single_p50_ms": statistics.median(single[1:]) * 1e3}


def report(r: dict[str, Any]) -> str:
    t, g, h = r["transformers"], r["graph"], r["http"]
    lines = [
        f"# Images a second: CLIP ViT-B/32 shape ({r['images']} JPEGs of photo sizes, batches of {r['batch']})",
        "",
        f"Machine: {r['cpu']}, {r['machine']['cpus']} cores; flags {r['machine']['cpu_flags']}; "
        f"{r['machine']['when']}.",
        "",
        "| path | images/s | vs transformers | preprocessing share | preprocessing ms/image |",
        "|---|---:|---:|---:|---:|",
        f"| transformers in-process (PIL processor + torch) | {t['images_per_s']:.1f} | 1.00x | {t['preprocessing_share']:.0%} | {t['preprocess_ms_per_image']:.1f} |",
        f"| headwise graph-direct (service/images + ONNX Runtime) | {g['images_per_s']:.1f} | {g['images_per_s'] / t['images_per_s']:.2f}x | {g['preprocessing_share']:.0%} | {g['preprocess_ms_per_image']:.1f} |",
        f"| headwise over HTTP ({r['clients']} clients, base64 JSON) | {h['images_per_s']:.1f} | {h['images_per_s'] / t['images_per_s']:.2f}x | | |",
        "",
        f"One image alone over HTTP on the idle server: p50 {h['single_p50_ms']:.1f} ms.",
        "",
        "The weights are random (no Hub here); the shapes, and so the time, are ViT-B/32's.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.images", description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=96)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--cache", type=Path, default=CACHE)
    p.add_argument("--tiny", action="store_true", help="a tiny tower (the bench's own test)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    name = "clip-tiny" if args.tiny else "clip-vit-b32-random"
    folder = checkpoint(args.cache / name, args.tiny)
    bundle = export(folder, args.cache / f"{name}-bundle")
    data = photos(args.images)
    results: dict[str, Any] = {
        "images": args.images, "batch": args.batch, "clients": args.clients, "machine": machine(),
        "model": name, "image_kb_mean": sum(map(len, data)) / len(data) / 1024, "cpu": cpu_name(),
    }  # fmt: skip
    log.info("transformers in-process")
    results["transformers"] = transformers_side(folder, data, args.batch)
    log.info("graph-direct")
    results["graph"] = graph_side(bundle, data, args.batch)
    log.info("over HTTP")
    results["http"] = http_side(bundle, data, args.batch, args.clients)
    save(args.out, "images", results, report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
