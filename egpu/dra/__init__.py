"""egpu as a DRA (Dynamic Resource Allocation) driver: the pure parts.

- ``slices``: a node's cards (``egpu.records.Card``) as resource.k8s.io/v1 ResourceSlices of
  the driver ``gpu.egpu.io`` with consumable capacity (``memory`` bytes, ``cores`` %), and the
  plan that brings the slices in the API server to them (create, update, delete, generation).
- ``allocation``: an allocated ResourceClaim of the driver -> the cards, MiB and cores each
  container of its pods gets (``egpu.records``): the one decoder of the node agent's kubelet
  plugin and of ``kubectl egpu``.

The names (driver, DeviceClasses, capacities, attributes) are in ``egpu.contract``.
"""
