"""The headwise service: serves a bundle folder with ONNX Runtime. Never imports torch."""

__version__ = "0.1.0"
