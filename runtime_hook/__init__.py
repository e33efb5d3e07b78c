"""egpu's OCI runtime hook (``egpu-hook``): puts the interposer and the share into a container.

Standard library plus the shared core's ``egpu.contract``, ``egpu.records`` (the one decoder
of the pod's allocation file and writer of the interposer's config) and ``egpu.card_roster``
(the one codec of the cards' rosters) only, so that it runs under the node's own python3
(installed as a one-file build by the node DaemonSet, see runtime_hook.bundle and
docs/node.md). The runtime runs it for every container the node creates, so its startup is
kept small: no ``typing``, ``dataclasses`` or ``argparse`` on its path, ``egpu.records`` only
for a pod with an allocation file, ``ctypes`` and ``egpu.card_roster`` only for a container
with a share. Modules: ``oci`` (wire formats), ``plan`` (pure decision), ``rootfs`` (safe
paths inside a root), ``hostfs`` (safe paths on the host), ``mounts`` (namespace entry and
bind mounts), ``main`` (entry point).
"""
