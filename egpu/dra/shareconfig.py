"""The opaque device configuration of a DRA share: ``ShareConfig`` (CONTRACT.md section 5).

A ResourceClaim carries it in ``spec.devices.config[].opaque`` for driver ``gpu.egpu.io``;
the webhook writes it (DRA mode) and the kubelet plugin reads it when it prepares the claim.
One encoder and one decoder, here::

    opaque:
      driver: gpu.egpu.io
      parameters:
        apiVersion: gpu.egpu.io/v1alpha1
        kind: ShareConfig
        priority: high | low                  (default high)
        computePolicy: strict | elastic       (default strict)
        memoryOversubscription: true | false  (default false)

A field left out takes its default (a claim written by hand may name only what it changes).
``decode`` raises ``ShareConfigError`` naming the field, the value and what is allowed for
anything else: an unknown field, a wrong type or value, another apiVersion or kind. The
kubelet plugin refuses to prepare such a claim (a share never runs unlimited).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from egpu.contract import (
    COMPUTE_POLICIES,
    DRA_CONFIG_API_VERSION,
    DRA_CONFIG_KIND,
    DRA_DRIVER,
    PRIORITIES,
)

_FIELDS = {"apiVersion", "kind", "priority", "computePolicy", "memoryOversubscription"}


class ShareConfigError(ValueError):
    """A ShareConfig is malformed; the message names the field, the value and what is allowed."""


@dataclass(frozen=True)
class ShareConfig:
    """What a share's claim says beyond its capacity: who goes first, how the cap behaves, and
    whether its memory may spill into host memory."""

    priority: str = "high"  # egpu.contract.PRIORITIES
    compute_policy: str = "strict"  # egpu.contract.COMPUTE_POLICIES
    memory_oversubscription: bool = False

    def __post_init__(self) -> None:
        if self.priority not in PRIORITIES:
            raise ShareConfigError(
                f"ShareConfig.priority: {self.priority!r}; allowed: {', '.join(PRIORITIES)}")
        if self.compute_policy not in COMPUTE_POLICIES:
            raise ShareConfigError(
                f"ShareConfig.computePolicy: {self.compute_policy!r}; "
                f"allowed: {', '.join(COMPUTE_POLICIES)}")

    def parameters(self) -> dict[str, Any]:
        """The ``opaque.parameters`` object (every field written)."""
        return {
            "apiVersion": DRA_CONFIG_API_VERSION,
            "kind": DRA_CONFIG_KIND,
            "priority": self.priority,
            "computePolicy": self.compute_policy,
            "memoryOversubscription": self.memory_oversubscription,
        }

    def opaque(self) -> dict[str, Any]:
        """The ``opaque`` object of a claim's ``spec.devices.config[]`` entry."""
        return {"driver": DRA_DRIVER, "parameters": self.parameters()}

    @classmethod
    def decode(cls, parameters: Any) -> ShareConfig:
        """The ShareConfig of ``opaque.parameters`` (a decoded JSON object). Raises
        ShareConfigError."""
        if not isinstance(parameters, dict):
            raise ShareConfigError(
                f"ShareConfig: {type(parameters).__name__} is not an object; allowed: an "
                f"object with apiVersion {DRA_CONFIG_API_VERSION} and kind {DRA_CONFIG_KIND}")
        for key, want in (("apiVersion", DRA_CONFIG_API_VERSION), ("kind", DRA_CONFIG_KIND)):
            if parameters.get(key) != want:
                raise ShareConfigError(
                    f"ShareConfig.{key}: {parameters.get(key)!r}; allowed: {want}")
        unknown = sorted(set(parameters) - _FIELDS)
        if unknown:
            raise ShareConfigError(
                f"ShareConfig: unknown field {unknown[0]!r}; allowed: {', '.join(sorted(_FIELDS))}")
        for key, kind in (("priority", str), ("computePolicy", str),
                          ("memoryOversubscription", bool)):
            if key in parameters and not isinstance(parameters[key], kind):
                raise ShareConfigError(
                    f"ShareConfig.{key}: {parameters[key]!r} is not a {kind.__name__}")
        defaults = cls()
        return cls(
            priority=parameters.get("priority", defaults.priority),
            compute_policy=parameters.get("computePolicy", defaults.compute_policy),
            memory_oversubscription=parameters.get(
                "memoryOversubscription", defaults.memory_oversubscription),
        )
