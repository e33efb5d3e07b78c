"""The kubelet plugin's state on disk: one file per prepared claim, keyed by its UID.

``<NODE_PRIVATE_DIR>/dra/claims/<claim-uid>.json`` (``PreparedClaim.encode``; folder 0700,
file 0600, written atomically) holds what was prepared, so that a repeated
NodePrepareResources answers the same and NodeUnprepareResources can remove the claim's files
after an agent restart, when the ResourceClaim itself may be gone from the API server.
Beside it, the files the runtime hook reads: each pod's allocation file and the claim's
shares file ``<NODE_PRIVATE_DIR>/claim-shares/<claim-uid>.json`` (for pods that join the
claim after it was prepared).
"""

from __future__ import annotations

import contextlib
import logging
import os

from egpu.contract import (
    ALLOCATIONS_SUBDIR,
    CLAIM_SHARES_SUBDIR,
    allocation_file_name,
    is_file_name,
)
from egpu.dra.allocation import ClaimError, PreparedClaim
from egpu.records import PodShares
from node_agent.cdi import write_spec

log = logging.getLogger(__name__)

STATE_SUBDIR = os.path.join("dra", "claims")
PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700


def _safe_uid(uid: str) -> str:
    """A claim or pod UID usable as a file name. Raises ClaimError."""
    if not is_file_name(uid):
        raise ClaimError(f"bad UID {uid!r}")
    return uid


class ClaimStore:
    """Prepared claims and the pods' allocation files under ``private_dir``."""

    def __init__(self, private_dir: str) -> None:
        self.private_dir = private_dir
        self.folder = os.path.join(private_dir, STATE_SUBDIR)

    def path(self, uid: str) -> str:
        """The state file of claim ``uid``."""
        return os.path.join(self.folder, f"{_safe_uid(uid)}.json")

    def load(self, uid: str) -> PreparedClaim | None:
        """The prepared claim ``uid``, None when not prepared. A malformed file is logged and
        read as absent (prepared again from the API server)."""
        try:
            with open(self.path(uid), encoding="utf-8") as handle:
                return PreparedClaim.decode(handle.read())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("claim state %s unreadable, ignored: %s", self.path(uid), exc)
            return None

    def all(self) -> list[PreparedClaim]:
        """Every prepared claim (unreadable files skipped)."""
        try:
            names = sorted(os.listdir(self.folder))
        except FileNotFoundError:
            return []
        found = (self.load(n.removesuffix(".json")) for n in names
                 if n.endswith(".json") and not n.startswith("."))
        return [c for c in found if c is not None]

    def save(self, claim: PreparedClaim) -> None:
        """Write the claim's state (atomic). Raises OSError."""
        os.makedirs(os.path.dirname(self.folder), mode=PRIVATE_DIR_MODE, exist_ok=True)
        write_spec(self.path(claim.uid), claim.encode() + "\n", PRIVATE_FILE_MODE,
                   PRIVATE_DIR_MODE)

    def remove(self, uid: str) -> None:
        """Forget claim ``uid`` (absent: nothing to do). Raises OSError."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(uid))

    def pod_file(self, pod_uid: str) -> str:
        """The pod's allocation file (the runtime hook reads it)."""
        return os.path.join(self.private_dir, ALLOCATIONS_SUBDIR,
                            allocation_file_name(_safe_uid(pod_uid)))

    def write_pod_file(self, shares: PodShares) -> None:
        """Write (or replace, atomically) the pod's allocation file. Raises OSError."""
        write_spec(self.pod_file(shares.pod_uid), shares.encode(), PRIVATE_FILE_MODE,
                   PRIVATE_DIR_MODE)

    def claim_shares_file(self, claim_uid: str) -> str:
        """The claim's shares file (egpu.dra.allocation.claim_shares; the hook reads it)."""
        return os.path.join(self.private_dir, CLAIM_SHARES_SUBDIR, f"{_safe_uid(claim_uid)}.json")

    def write_claim_shares(self, shares: PodShares) -> None:
        """Write (or replace, atomically) the claim's shares file (``shares.pod_uid``: the
        claim's UID). Raises OSError."""
        write_spec(self.claim_shares_file(shares.pod_uid), shares.encode(), PRIVATE_FILE_MODE,
                   PRIVATE_DIR_MODE)

    def remove_claim_shares(self, claim_uid: str) -> None:
        """Remove the claim's shares file (absent: nothing to do). Raises OSError."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.claim_shares_file(claim_uid))

    def pod_uids(self) -> set[str]:
        """The pods named by a prepared claim (their allocation files are the plugin's)."""
        return {p.uid for c in self.all() for p in c.pods}
