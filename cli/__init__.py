"""The ``egpu`` command: wires the parts together for people (explain, run, certs, dev-cluster)."""
