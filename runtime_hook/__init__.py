"""egpu's OCI runtime hook (``egpu-hook``): puts the interposer and the share into a container.

Standard library plus the shared core's ``egpu.contract`` and ``egpu.records`` only, so that it
runs under the node's own python3 (installed as a zipapp by the node DaemonSet); see
docs/node.md. Modules: ``oci`` (wire formats), ``plan`` (pure decision), ``rootfs`` (safe
paths inside a root), ``mounts`` (namespace entry and bind mounts), ``main`` (entry point).
"""
