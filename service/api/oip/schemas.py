"""The Open Inference Protocol's answers, for the OpenAPI document (`infer`'s body is read by
its handler: JSON, or JSON followed by binary tensors)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ServerLive(BaseModel):
    live: bool
    status: str = Field(description="headwise's own /health word, for probes that read it")


class ServerReady(BaseModel):
    ready: bool
    status: str = Field(description="headwise's own /ready word: ready, loading, draining, failed")


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int] = Field(description="-1: any size")
    optional: bool = False


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ModelReady(BaseModel):
    name: str
    ready: bool


class OutputTensor(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    data: list[float] | None = Field(None, description="row-major; absent when binary")
    parameters: dict[str, Any] | None = Field(None, description="binary_data_size, when binary")


class InferResponse(BaseModel):
    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[OutputTensor]
