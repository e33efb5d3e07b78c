"""The demo (``egpu demo``, ``make demo``): every part of egpu on a local cluster.

Wires the parts together like ``cli/`` does: the local control plane with simulated GPU nodes,
the webhook, egpu-kube-scheduler, one node agent per node on the fake GPU, the workloads of
../shared/inputs/pods, a placement table, and one real runc container with a share.
"""
