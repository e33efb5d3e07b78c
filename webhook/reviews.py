"""The AdmissionReview wire format, declared once (admission.k8s.io/v1).

Source: the Kubernetes API types ``k8s.io/api/admission/v1`` (``AdmissionReview``,
``AdmissionRequest``, ``AdmissionResponse``) and ``k8s.io/apimachinery/pkg/apis/meta/v1``
(``Status``, ``GroupVersionKind``, ``GroupVersionResource``, ``UserInfo``). JSON field names
are the Go structs' ``json`` tags. Only the fields egpu reads or writes are spelled out; the
API server sends more (``userInfo``, ``options``, ...), which are accepted and ignored.

The API server POSTs an ``AdmissionReview`` whose ``request`` is set; the webhook answers an
``AdmissionReview`` of the same ``apiVersion`` whose ``response`` is set and echoes
``request.uid``. A mutation travels as ``patch`` (base64 of a JSON Patch, RFC 6902, UTF-8)
with ``patchType: "JSONPatch"``; both are absent when nothing changes.
"""

from __future__ import annotations

from typing import Any, Final, Literal, NotRequired, TypedDict

API_GROUP: Final = "admission.k8s.io"
API_VERSION_V1: Final = "admission.k8s.io/v1"
API_VERSION_V1BETA1: Final = "admission.k8s.io/v1beta1"  # same shapes; answered in kind
API_VERSIONS: Final = (API_VERSION_V1, API_VERSION_V1BETA1)
KIND: Final = "AdmissionReview"
PATCH_TYPE_JSON: Final = "JSONPatch"

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


class GroupVersionKind(TypedDict):
    """``metav1.GroupVersionKind``: ``{"group": "", "version": "v1", "kind": "Pod"}``."""

    group: str
    version: str
    kind: str


class GroupVersionResource(TypedDict):
    """``metav1.GroupVersionResource``: ``{"group": "", "version": "v1", "resource": "pods"}``."""

    group: str
    version: str
    resource: str


class AdmissionRequest(TypedDict):
    """``admissionv1.AdmissionRequest``: what is being admitted.

    uid: identifies this call; echoed in the response. object: the new object (CREATE,
    UPDATE), already defaulted by the API server; null for DELETE. dryRun: true when the call
    must have no side effects (egpu's review has none, so it answers the same).
    """

    uid: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    subResource: NotRequired[str]
    name: NotRequired[str]
    namespace: NotRequired[str]
    operation: Operation
    object: NotRequired[dict[str, Any] | None]
    oldObject: NotRequired[dict[str, Any] | None]
    dryRun: NotRequired[bool]
    userInfo: NotRequired[dict[str, Any]]
    options: NotRequired[dict[str, Any] | None]


class Status(TypedDict):
    """``metav1.Status`` as used in a denial: code (HTTP-like), reason (a StatusReason
    such as ``BadRequest`` or ``Forbidden``) and a human message (kubectl shows it)."""

    code: int
    reason: NotRequired[str]
    message: str


class AdmissionResponse(TypedDict):
    """``admissionv1.AdmissionResponse``.

    patch: base64 of the JSON Patch text; patchType: "JSONPatch"; both only with a patch.
    warnings: shown by kubectl as ``Warning: ...``; each under 120 characters is best.
    """

    uid: str
    allowed: bool
    status: NotRequired[Status]
    patch: NotRequired[str]
    patchType: NotRequired[Literal["JSONPatch"]]
    warnings: NotRequired[list[str]]


class AdmissionReview(TypedDict):
    """``admissionv1.AdmissionReview``: request in (from the API server), response out."""

    apiVersion: str
    kind: Literal["AdmissionReview"]
    request: NotRequired[AdmissionRequest]
    response: NotRequired[AdmissionResponse]
