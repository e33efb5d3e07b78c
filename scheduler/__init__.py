"""egpu's scheduler extender: card-level placement behind kube-scheduler.

Layers, lowest first: ``strategies`` and ``placement`` (pure placement maths over
dataclasses), ``state`` (the in-memory cluster view built from API objects), ``wire`` (the
extender protocol's JSON shapes), ``extender`` (filter / prioritize / bind over the view),
``kube`` (API list+watch and bind's writes), ``app`` (the aiohttp edge), ``main`` (wiring,
the ``egpu-extender`` command). See docs/scheduler.md.
"""
