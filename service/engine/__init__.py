"""The machinery under the pipelines: ONNX Runtime sessions and the backend, the dynamic
batcher and its policy, admission by capacity, memory accounting and trimming."""
