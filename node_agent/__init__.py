"""egpu's node agent (``egpu-node-agent``): one process per GPU node.

- ``discovery`` / ``health``: the cards through NVML (pynvml), XID events mark a card unhealthy;
- ``inventory``: the node annotations ``egpu.io/inventory`` and ``egpu.io/inventory-heartbeat``;
- ``pods``: the pods bound to this node, their allocation files for the runtime hook;
- ``deviceplugin``: the kubelet device plugin (v1beta1) for ``egpu.io/gpu`` slots;
- ``cdi``: the node's CDI spec (``/var/run/cdi/egpu.json``) and the CDI device names that
  Allocate returns (also used by ``egpu cdi generate``);
- ``metrics``: the Prometheus exporter over the accounting regions and NVML;
- ``dra``: with ``--dra``, the node's ResourceSlices of the DRA driver ``gpu.egpu.io``;
- ``draplugin``: with ``--dra``, its kubelet plugin (registration, NodePrepareResources);
- ``main``: wiring and the command line.
"""
