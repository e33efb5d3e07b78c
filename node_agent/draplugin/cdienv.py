"""The environment of a prepared claim's CDI devices (the node's side of a claim).

``request_envs(claim)``: per request of the claim (its base name), the environment of its CDI
device ``claim-<uid>-<request>`` (``claim_request_device``): ``NVIDIA_VISIBLE_DEVICES`` (that
request's cards) and ``EGPU_DEVICES`` (the mark of a container given egpu devices: the hook
refuses it when no allocation entry names it), as the device plugin's Allocate writes them
(``node_agent.deviceplugin.matching.allocate_envs``). A container is given the devices of the
requests it names, so it sees only their cards. The claim itself is decoded by the shared core
(``egpu.dra.allocation``).
"""

from __future__ import annotations

from egpu.dra.allocation import PreparedClaim, base_request
from node_agent.deviceplugin.matching import Ambiguous, allocate_envs


def request_envs(claim: PreparedClaim) -> dict[str, dict[str, str]]:
    """Request (base name) -> the environment of its CDI device (module docstring): variable
    -> value; the cards in allocation order, each once."""
    uuids: dict[str, list[str]] = {}
    for d in claim.devices:
        cards = uuids.setdefault(base_request(d.request), [])
        if d.uuid not in cards:
            cards.append(d.uuid)
    return {request: allocate_envs(Ambiguous(tuple(cards), ()),
                                   [claim_request_device(claim.uid, request)])
            for request, cards in uuids.items()}


def claim_request_device(claim_uid: str, request: str) -> str:
    """The CDI device name of one request of a prepared claim: ``claim-<uid>-<request>``."""
    return f"claim-{claim_uid}-{request}"
