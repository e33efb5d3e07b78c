"""The kubelet device plugin API v1beta1 for ``egpu.io/gpu``.

``api.proto`` (written from the public v1beta1 API) and its generated stubs ``api_pb2*.py``
(regenerate with ``regen.sh``); ``slots`` and ``matching`` are the pure logic; ``service`` is
the thin gRPC edge (server, registration with the kubelet, re-registration).
"""
