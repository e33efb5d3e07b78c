"""The kubelet DRA plugin of the driver ``gpu.egpu.io`` (``egpu-node-agent --dra``).

``proto/`` holds the kubelet's plugin registration API (pluginregistration/v1) and DRA plugin
API (dra/v1, dra/v1beta1), copied from k8s.io/kubelet v0.37.2, and their generated stubs
(``regen.sh``). The pure core is shared: ``egpu.dra.allocation`` turns a ResourceClaim's
allocation and opaque ShareConfig into the pods' allocation files (the same decoder
``kubectl egpu`` uses); here ``cdienv`` gives the claim's CDI devices their environment,
``state`` keeps the per-claim state on disk; ``driver`` prepares and unprepares claims;
``kube`` reads claims and pods from the API server; ``service`` is the gRPC edge
(registration, DRA service, sockets).
"""
