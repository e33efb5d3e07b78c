"""Requests to the API server as plain JSON, through a ``kubernetes`` ApiClient.

``api_request`` uses the client's connection, TLS and credentials and none of its model
classes (whose validation of request and answer bodies varies between client releases); a
non-2xx answer raises ``ApiError`` (``.status``: the HTTP code).
"""

from __future__ import annotations

import json
from typing import Any

from devcluster.errors import DevClusterError

MERGE_PATCH = "application/merge-patch+json"


class ApiError(DevClusterError):
    """A non-2xx answer of the API server: ``status`` (HTTP code) and its message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def api_request(
    api_client: Any,
    method: str,
    path: str,
    body: Any = None,
    content_type: str | None = None,
    query: dict[str, Any] | None = None,
    timeout: float = 30.0,
) -> Any:
    """Send one request through a kubernetes ``ApiClient``; the decoded JSON answer.

    Raises ``ApiError`` for a non-2xx answer."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type or "application/json"
    method, url, headers, body, _ = api_client.param_serialize(
        method=method,
        resource_path=path,
        query_params=[(k, v) for k, v in (query or {}).items() if v is not None],
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api_client.call_api(method, url, header_params=headers, body=body,
                                   _request_timeout=timeout)
    text = response.read().decode("utf-8", "replace")
    if not 200 <= response.status < 300:
        try:
            message = json.loads(text).get("message", text)
        except ValueError:
            message = text
        raise ApiError(response.status, message)
    return json.loads(text) if text else None
