"""egpu's mutating admission webhook (issue 4): routes GPU-sharing pods to the egpu scheduler,
gives them the contract's labels, env and runtime mount, and denies bad ones clearly.

Layers: ``reviews`` (the admission.k8s.io/v1 wire shapes) < ``review`` (pure decision and
patch) < ``server`` (aiohttp edge), ``tls``, ``metrics`` < ``main`` (``egpu-webhook``).
"""
