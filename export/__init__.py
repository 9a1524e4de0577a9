"""PyTorch -> ONNX: the fused serving graph, the attention debug graph, and the bundle folder."""
