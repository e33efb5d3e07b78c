"""The one error of the dev cluster's tooling.

Every module of devcluster raises ``DevClusterError`` (or a subclass: ``ApiError`` of
devcluster.kubeapi, ``ProcessFailed`` of devcluster.supervisor, ``AlreadyRunning`` of
devcluster.cluster) with a message that says what failed and why; the CLI prints it.
"""

from __future__ import annotations


class DevClusterError(RuntimeError):
    """The dev cluster could not be started, found or stopped; the message says why."""
