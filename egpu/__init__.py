"""egpu's shared core: the contract's names, request parsing, records and configuration.

Pure (no network, no Kubernetes client): every deployable part imports it; it imports no part.
"""
