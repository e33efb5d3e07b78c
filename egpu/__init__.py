"""egpu's shared core: the contract's names, request parsing, records and configuration, and
the codec of the node's per-card roster (card_roster).

Pure (no network, no Kubernetes client): every deployable part imports it; it imports no part.
"""
