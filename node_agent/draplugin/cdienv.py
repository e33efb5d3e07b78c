"""The environment of a prepared claim's CDI devices (the node's side of a claim).

``request_envs(claim)``: per request of the claim (its base name), the environment of its CDI
device ``claim-<uid>-<request>`` (``claim_request_device``): ``NVIDIA_VISIBLE_DEVICES`` (that
request's cards) and ``EGPU_DEVICES`` (the mark of a container given egpu devices: the hook
refuses it when no allocation entry names it), as the device plugin's Allocate writes them
(``node_agent.deviceplugin.matching.allocate_envs``), and
``EGPU_CLAIM_SHARE_<claim-uid>_<request>`` (``egpu.contract.claim_share_env``: which requests
of which claim the container was given, for a pod that joins the claim after it was
prepared; the hook then reads the claim's shares file). A container is given the devices of the
requests it names, so it sees only their cards. The claim itself is decoded by the shared core
(``egpu.dra.allocation``).
"""

from __future__ import annotations

from egpu.contract import claim_request_device, claim_share_env
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
    out = {}
    for request, cards in uuids.items():
        env = allocate_envs(Ambiguous(tuple(cards), ()), [claim_request_device(claim.uid, request)])
        name, value = claim_share_env(claim.uid, request)
        out[request] = {**env, name: value}
    return out
