"""egpu's OCI runtime hook (``egpu-hook``): puts the interposer and the share into a container.

Standard library plus the shared core's ``egpu.contract`` only, so that it runs under the
node's own python3 (installed as a zipapp by the node DaemonSet); see docs/node.md. The
runtime runs it for every container the node creates, so its startup is kept small: no
``typing``, ``dataclasses``, ``argparse`` or ``json`` package on its path, ``ctypes`` only for a
container with a share. Modules: ``oci`` (wire formats), ``fastjson`` (json.loads through the
C scanner), ``shares`` (the allocation file and the interposer's config, as egpu.records
defines them), ``plan`` (pure decision), ``rootfs`` (safe paths inside a root), ``mounts``
(namespace entry and bind mounts), ``main`` (entry point).
"""
