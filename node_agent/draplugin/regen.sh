#!/bin/sh
# Regenerate the Python stubs of the kubelet plugin registration API (pluginregistration/v1)
# and the DRA plugin API (dra/v1, dra/v1beta1) from proto/*.proto, copied from
# k8s.io/kubelet@v0.37.2 (the kubelet v1.37.2 that devcluster builds; its Go module cache is
# ~/.cache/egpu/go/mod/k8s.io/kubelet@v0.37.2/pkg/apis/). Needs grpcio-tools
# (pip install -e '.[dev]'). The generated files are committed.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${PYTHON:-"$root/.venv/bin/python"}
cd "$root"
PATH="$(dirname "$python"):$PATH" "$python" -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. \
    --mypy_out=. --mypy_grpc_out=. \
    node_agent/draplugin/proto/registration_v1.proto \
    node_agent/draplugin/proto/dra_v1.proto \
    node_agent/draplugin/proto/dra_v1beta1.proto
