# The one egpu image, ghcr.io/egpu/egpu:0.1.0: every Python part (egpu-webhook,
# egpu-node-agent, egpu-hook's build, the egpu CLI) and the interposer library, which the node
# DaemonSet's init container copies from /opt/egpu/lib to the host (manifests/node).
#
#   docker build -t ghcr.io/egpu/egpu:0.1.0 .
#
# Debian bookworm, as `make image` (devcluster/images.py) builds the same content without Docker.
# Pinned, not python:3.11-slim (which follows Debian's newest release): the interposer is
# LD_PRELOADed into workload containers, so the glibc it is linked against (bookworm: 2.36,
# symbols up to GLIBC_2.34) bounds the containers it loads into.

# --- the interposer (C, no CUDA toolkit needed), built on the runtime image's Debian --------
FROM python:3.11-slim-bookworm AS interposer
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY libinterpose/ libinterpose/
RUN make -C libinterpose build/libegpu_interpose.so

# --- the Python parts -------------------------------------------------------------------------
FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY egpu/ egpu/
COPY cli/ cli/
COPY webhook/ webhook/
COPY scheduler/ scheduler/
COPY node_agent/ node_agent/
COPY runtime_hook/ runtime_hook/
COPY certs/ certs/
RUN pip install . && rm -rf /src
WORKDIR /
COPY --from=interposer /src/libinterpose/build/libegpu_interpose.so /opt/egpu/lib/libegpu_interpose.so
CMD ["egpu", "--help"]
