"""egpu's placement in Python: the reference the Go plugin is held to, and the view
``kubectl egpu advise`` reads a cluster into.

Layers, lowest first: ``strategies`` and ``placement`` (pure placement maths over
dataclasses; kube-scheduler/placement is its Go port, held to the same cases by
tests/scheduler/test_placement_port.py), ``state`` (the in-memory cluster view built from API
objects), ``kube`` (plain JSON access to the API for the tools and benchmarks). The shipped
scheduler is egpu-kube-scheduler (kube-scheduler/, docs/scheduler.md).
"""
