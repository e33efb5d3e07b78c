#!/bin/sh
# Regenerate the Python stubs of the kubelet device plugin API (v1beta1) from api.proto.
# Needs grpcio-tools (pip install -e '.[dev]'). The generated files are committed.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${PYTHON:-"$root/.venv/bin/python"}
cd "$root"
PATH="$(dirname "$python"):$PATH" "$python" -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. \
    --mypy_out=. --mypy_grpc_out=. \
    node_agent/deviceplugin/api.proto
