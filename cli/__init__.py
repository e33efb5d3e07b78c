"""The ``egpu`` command: wires the parts together for people (explain, run, certs, dev-cluster)."""

# The demo and the dev cluster (demo/, devcluster/) are development tools of the repository,
# not part of the egpu package (pyproject's package list): their commands say so.
NOT_IN_THE_WHEEL = ("{command}: the demo and the dev cluster run from a clone of the egpu "
                    "repository (they are not part of the installed egpu package): clone it "
                    "and run `make demo` there (README.md)")
