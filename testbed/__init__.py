"""Helpers that the tests and the benchmarks share (never the product's: not in the wheel).

- ``realnode_install``: egpu installed on the dev cluster's real node as a user would
  (``kubectl apply -k`` with the local image, the webhook's TLS), and share pods running the
  probe there.
- ``fakenode``: a fake node (fake cards, an egpu runtime folder) on which the real-time compute
  benchmarks run compute_load shares under the interposer.
- ``regions``: synthetic accounting regions (egpu_region.h v1) for the exporter's tests and
  benchmark.
"""
