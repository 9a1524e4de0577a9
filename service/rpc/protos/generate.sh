#!/usr/bin/env bash
# Regenerates service/rpc/generated/ from the vendored protos (`make protos`).
#
# grpcio-tools 1.80 (protoc for protobuf 6.31: the runtime tritonclient[grpc] also needs) runs
# from a throwaway venv: it is not a dependency of headwise. The generated modules register
# their descriptors in a pool of their own (service/rpc/generated/__init__.py's POOL), not
# protobuf's default one, so that a process that also loads another copy of these protos
# (tritonclient's `inference` package, tei-client's `tei.v1`) does not clash with ours.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${TMPDIR:-/tmp}/headwise-protoc"
[ -x "$venv/bin/python" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q grpcio-tools==1.80.0; }
rm -f generated/*_pb2*.py generated/*_pb2*.pyi
"$venv/bin/python" -m grpc_tools.protoc -Iprotos --python_out=generated --pyi_out=generated \
    --grpc_python_out=generated protos/grpc_predict_v2.proto protos/tei.proto
for f in generated/*_pb2.py; do
    sed -i 's/^from google.protobuf import descriptor_pool as _descriptor_pool$/from service.rpc.generated import POOL/;
            s/_descriptor_pool.Default()/POOL/' "$f"
done
for f in generated/*_pb2_grpc.py; do
    sed -i -E 's/^import (\w+_pb2) as /from service.rpc.generated import \1 as /' "$f"
done
