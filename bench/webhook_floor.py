"""The floor of a mutating webhook call, for bench/webhook.py: an aiohttp server over TLS that
answers every AdmissionReview allowed with a one-operation JSON patch (a label), and does
nothing else. What the API server spends calling it is what any aiohttp webhook costs on
this machine; what egpu's webhook adds above it is egpu's own.

Usage: ``python bench/webhook_floor.py CERT KEY PORT LABEL`` (127.0.0.1; the patch sets label
LABEL to ``called``; ``/healthz`` answers 200).
"""

from __future__ import annotations

import base64
import json
import ssl
import sys

from aiohttp import web

HOST = "127.0.0.1"


def label_patch(label: str) -> str:
    """The base64 JSON patch (RFC 6902) that sets ``label`` to ``called``."""
    op = {"op": "add", "path": "/metadata/labels/" + label.replace("~", "~0").replace("/", "~1"),
          "value": "called"}
    return base64.b64encode(json.dumps([op]).encode()).decode()


def app_for(patch: str) -> web.Application:
    async def mutate(request: web.Request) -> web.Response:
        review = await request.json()
        return web.json_response({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], "allowed": True,
                         "patchType": "JSONPatch", "patch": patch}})

    app = web.Application()
    app.router.add_post("/mutate", mutate)
    app.router.add_get("/healthz", healthz)
    return app


async def healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def main(argv: list[str]) -> None:
    cert, key, port, label = argv
    app = app_for(label_patch(label))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    web.run_app(app, host=HOST, port=int(port), ssl_context=context, access_log=None,
                print=None)


if __name__ == "__main__":
    main(sys.argv[1:])
