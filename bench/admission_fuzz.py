"""Admission fuzz: the real webhook against random, mutated and malformed AdmissionReviews.

Starts the webhook as its own process (``python -m webhook.main``, HTTPS on 127.0.0.1 with a
fresh private CA, as ``bench/webhook.py`` does) and POSTs ``--reviews`` bodies to /mutate,
``--concurrency`` at a time (keep-alive TLS connections), stopping at ``--max-seconds``.
The bodies (seeded by ``--seed``; shares below are of all bodies):

- 65% the shared pod inputs (``../shared/inputs/pods``, or ``$EGPU_SHARED_DIR/inputs/pods``,
  or ``--inputs``) with 1 to 3 mutations each: a field egpu reads set to a value of the wrong
  JSON type (``spec.containers: 7``), any field set to an odd value (null, booleans, NaN and
  Infinity, floats, huge integers, long or non-UTF-8-safe strings, lists, objects, deep
  nesting, egpu resource names in odd places), a field removed or wrapped in a list or an
  object, a container repeated many times; 5% the inputs as they are;
- 15% pods made from scratch (random containers, init containers, sidecars, limits and
  requests of egpu, alias and other names with random quantities, egpu annotations,
  nodeName, privileged, hostPath volumes);
- 15% malformed envelopes and bodies: a missing or wrongly typed ``request``, ``uid``,
  ``kind``, ``operation`` or ``object``; a wrong ``apiVersion`` or ``kind``; truncated JSON;
  JSON of another type; not JSON (random bytes, invalid UTF-8, text); an empty body;
- 0.1% huge bodies: 3 MiB strings, thousands of containers, nesting deeper than any parser
  allows, bodies over the webhook's 4 MiB limit.

Counted (every count must be 0):

- ``http_5xx``: answers with an HTTP status >= 500;
- ``internal_errors``: denials with ``code: 500`` or the "internal error" message;
- ``crashes``: times the webhook process died (it is restarted and the run goes on);
- ``hangs``: requests not answered within ``--hang-seconds`` (5, the manifest's
  ``timeoutSeconds``);
- ``unnamed_denials``: denials with a problem that names no field (a JSON path like
  ``spec.containers[0].resources.limits``, ``container 'c': <resource>``, ``pod annotation``,
  ``volume``), and 4xx answers whose reason names no field (``body``, ``apiVersion``,
  ``kind``, ``request...``).

Also checked and printed above the last line (and failing the run): answers to a valid
envelope that are not an AdmissionReview echoing its uid, patches that are not base64 JSON,
and transport errors while the webhook lives. Exit status 0 when every count is 0 and all
``--reviews`` were sent in time, else 1.

The last line is exactly ``reviews=N http_5xx=N internal_errors=N crashes=N hangs=N
unnamed_denials=N reviews_per_s=N``.

Usage: ``.venv/bin/python bench/admission_fuzz.py [--reviews 100000] [--concurrency 16]
[--max-seconds 1200] [--hang-seconds 5] [--seed 1] [--inputs DIR]``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import json
import os
import random
import re
import ssl
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

REPO = Path(__file__).resolve().parent.parent
# bench/webhook.py is named like the package it measures: keep bench/ off the import path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

from certs.issue import create_ca, create_serving, write_bundle  # noqa: E402
from devcluster.errors import DevClusterError  # noqa: E402
from devcluster.webhook_process import WebhookProcess  # noqa: E402
from egpu.podshape import path_pattern  # noqa: E402
from egpu.workloads import pod_templates  # noqa: E402

SHARED = Path(os.environ.get("EGPU_SHARED_DIR", REPO.parent / "shared"))
MAX_BODY_BYTES = 4 * 1024 * 1024  # the webhook's limit (webhook.server.DEFAULT_MAX_BODY_BYTES)
RAW = "__egpu_fuzz_raw__"  # a string value replaced by raw JSON text after encoding

# A denial's problem names its field when it starts like this; a 4xx reason likewise.
NAMED_PROBLEM = re.compile(
    r"^(spec\b|metadata\b|pod\b|container ['\"]|pod annotation |volume ['\"])")
MORE_PROBLEMS = re.compile(r"^and \d+ more problems$")
NAMED_REASON = re.compile(r"^(body\b|apiVersion\b|kind\b|request(\.[A-Za-z]+)*\b)")

EGPU_NAMES = ["egpu.io/gpu", "egpu.io/gpu-memory", "egpu.io/gpu-memory-percentage",
              "egpu.io/gpu-cores"]
ALIASES = ["volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores",
           "volcano.sh/vgpu-memory-percentage"]
OTHER_RESOURCES = ["cpu", "memory", "nvidia.com/gpu", "ephemeral-storage", "egpu.io/gpu-memry"]
QUANTITIES: list[Any] = ["1", "2", "16", "17", "50", "100", "101", "3000", "24000", "0", "-1",
                         "", "24Gi", "1.5", "500m", "3k", "1e3", "+5", " 7 ", 5, 2.0, 2.5,
                         True, None, "NaN", "Infinity", "9" * 41, 10**30]
ANNOTATIONS: dict[str, list[str]] = {
    "egpu.io/priority": ["high", "low", "urgent", ""],
    "egpu.io/compute-policy": ["strict", "elastic", "x"],
    "egpu.io/memory-oversubscription": ["true", "false", "yes"],
    "egpu.io/gpu-policy": ["binpack", "spread", "x"],
    "egpu.io/node-policy": ["binpack", "spread"],
    "egpu.io/use-gpu-type": ["A10", "H100,A100", ",", ""],
    "egpu.io/nouse-gpu-uuid": ["GPU-1", "GPU-1,,GPU-2"],
    "egpu.io/allocation": ["{}"],
    "team": ["ml"],
}

# The fields egpu reads ("#": a list index, "*": a map key) and their JSON type.
READ_FIELDS: dict[tuple[str, ...], str] = {
    ("metadata",): "object", ("metadata", "labels"): "object",
    ("metadata", "labels", "*"): "string", ("metadata", "annotations"): "object",
    ("metadata", "annotations", "*"): "string", ("metadata", "namespace"): "string",
    ("spec",): "object", ("spec", "containers"): "list", ("spec", "initContainers"): "list",
    ("spec", "schedulerName"): "string", ("spec", "priorityClassName"): "string",
    ("spec", "nodeName"): "string", ("spec", "hostPID"): "boolean",
    ("spec", "hostIPC"): "boolean", ("spec", "volumes"): "list",
    ("spec", "volumes", "#"): "object", ("spec", "volumes", "#", "hostPath"): "object",
    ("spec", "volumes", "#", "hostPath", "path"): "string",
}
for _kind in ("containers", "initContainers"):
    for _sub, _type in {(): "object", ("name",): "string", ("restartPolicy",): "string",
                        ("resources",): "object", ("resources", "limits"): "object",
                        ("resources", "limits", "*"): "quantity",
                        ("resources", "requests"): "object",
                        ("resources", "requests", "*"): "quantity", ("env",): "list",
                        ("env", "#"): "object", ("env", "#", "name"): "string",
                        ("env", "#", "value"): "string", ("securityContext",): "object",
                        ("securityContext", "privileged"): "boolean",
                        ("securityContext", "capabilities", "add"): "list"}.items():
        READ_FIELDS[("spec", _kind, "#", *_sub)] = _type
WRONG: dict[str, list[Any]] = {
    "object": [7, 0, True, False, "x", [1], [], 1.5],
    "list": [7, 0, True, False, "x", {"a": 1}, {}, -2.5],
    "string": [7, True, [], {"a": "b"}, 1.5],
    "boolean": ["true", 1, 0, [], {}],
    "quantity": [[1], {"a": 1}, []],
}


# --- bodies ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    """JSON text written as is in a body (what ``json.dumps`` cannot write)."""

    text: str


def load_pods(folder: Path) -> list[dict[str, Any]]:
    """Every pod template in the YAML files of ``folder``, as a Pod object."""
    pods = []
    for path in sorted(folder.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            for template in pod_templates(doc):
                pod = dict(template.pod)
                metadata = dict(pod.get("metadata") or {})
                metadata.setdefault("namespace", template.namespace)
                pods.append(json.loads(json.dumps({
                    "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
                    "spec": pod.get("spec") or {}})))
    return pods


def admission_review(pod: Any, uid: str) -> dict[str, Any]:
    """The AdmissionReview (admission.k8s.io/v1) for creating ``pod``, as the API server
    sends it."""
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "namespace": "fuzz", "operation": "CREATE", "object": pod,
        "userInfo": {"username": "fuzz"}, "dryRun": False}}


def _nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for index in range(depth):
        value = [value] if index % 2 else {"k": value}
    return value


def odd_value(rng: random.Random) -> Any:
    """A value no pod author should write: see the module docstring. A ``Raw`` is written
    as raw JSON text (numbers too long to convert, NaN, invalid UTF-8)."""
    pick = rng.randrange(20)
    if pick == 0:
        return rng.choice([None, True, False, 0, -1, 1.5, -0.0, 1e308, 2**63, -(2**64)])
    if pick == 1:
        return float(rng.choice(["nan", "inf", "-inf"]))
    if pick == 2:
        return int("9" * rng.randint(20, 4000))
    if pick == 3:
        return Raw(rng.choice(["9" * rng.randint(4301, 20000), "NaN", "-Infinity",
                                 "1e99999", "-0", '"\\ud800"', '"\\udfff\\ud800x"',
                                 '"\udcff\udcfe"', '"\\u0000"']))
    if pick == 4:
        return rng.choice(["NaN", "Infinity", "nan", "-inf", "1e400", "0x10", "1_000", "٣"])
    if pick == 5:
        return rng.choice(["x", "y"]) * rng.choice([100, 5000, 100_000])
    if pick == 6:
        return rng.choice(EGPU_NAMES + ALIASES) + rng.choice(["", ": 1", "=3000"])
    if pick == 7:
        return _nested(rng.randint(10, 400), rng.choice([None, "egpu.io/gpu", 1]))
    if pick == 8:
        return [rng.choice([None, 1, "a", {}, []]) for _ in range(rng.randint(0, 20))]
    if pick == 9:
        return {rng.choice(EGPU_NAMES + ALIASES + ["a", ""]): rng.choice(QUANTITIES)
                for _ in range(rng.randint(0, 4))}
    if pick == 10:
        return {"limits": {rng.choice(EGPU_NAMES): "1"}}
    if pick == 11:
        return [{"name": "c", "resources": {"limits": {rng.choice(EGPU_NAMES): "1"}}}]
    if pick == 12:
        return "".join(chr(rng.choice([0, 7, 0x85, 0x2028, 0xFEFF, 0x1F600, 0x10FFFF]))
                       for _ in range(rng.randint(1, 30)))
    return rng.choice(QUANTITIES)



def _paths(value: Any, path: tuple[Any, ...] = (), depth: int = 12) -> list[tuple[Any, ...]]:
    """Every path in ``value`` (no deeper than ``depth``)."""
    out = [path] if path else []
    if len(path) >= depth:
        return out
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*path, key), depth)
    elif isinstance(value, list):
        for index, item in enumerate(value[:50]):
            out += _paths(item, (*path, index), depth)
    return out


def _parent(root: Any, path: tuple[Any, ...]) -> Any:
    for part in path[:-1]:
        root = root[part]
    return root


def mutate(pod: dict[str, Any], rng: random.Random) -> None:
    """Apply one random mutation to ``pod`` (in place): a read field of the wrong type, an
    odd value, a field removed or wrapped (see the module docstring)."""
    paths = _paths(pod)
    if not paths:
        return
    choice = rng.randrange(9)
    read = [p for p in paths if path_pattern(p) in READ_FIELDS]
    if choice < 4 and read:
        path = rng.choice(read)
        _parent(pod, path)[path[-1]] = rng.choice(WRONG[READ_FIELDS[path_pattern(path)]])
        return
    path = rng.choice(paths)
    parent = _parent(pod, path)
    if choice < 7:
        parent[path[-1]] = odd_value(rng)
    elif choice == 7:
        del parent[path[-1]]
    else:
        parent[path[-1]] = rng.choice([[parent[path[-1]]], {"x": parent[path[-1]]}])


def repeat_container(pod: dict[str, Any], rng: random.Random) -> None:
    """Repeat the first container 10, 100 or 1000 times, keeping the pod under about 300 kB
    (a long string in a repeated container would make bodies of 100 MB that only slow the
    load generator: the webhook refuses any body over 4 MiB unread)."""
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, dict) else None
    if not isinstance(containers, list) or not containers:
        return
    try:
        size = len(json.dumps(containers[0], default=lambda raw: raw.text))
    except (RecursionError, ValueError):
        return
    times = min(rng.choice([10, 100, 1000]), 300_000 // max(size, 1))
    containers.extend([containers[0]] * times)


def random_container(rng: random.Random, name: str) -> dict[str, Any]:
    """A container with random limits (and sometimes requests, env, securityContext)."""
    names = rng.sample(EGPU_NAMES + ALIASES + OTHER_RESOURCES, rng.randint(0, 4))
    limits = {n: rng.choice(QUANTITIES) for n in names}
    container: dict[str, Any] = {"name": name, "image": "busybox",
                                 "resources": {"limits": limits}}
    if rng.random() < 0.3:
        container["resources"]["requests"] = rng.choice([dict(limits), {"cpu": "1"}])
    if rng.random() < 0.3:
        container["env"] = [{"name": rng.choice(["EGPU_PRIORITY", "HOME"]), "value": "low"}]
    if rng.random() < 0.1:
        container["securityContext"] = {"privileged": rng.random() < 0.5, "capabilities": {
            "add": [rng.choice(["SYS_ADMIN", "NET_ADMIN", "cap_sys_ptrace"])]}}
    return container


def random_pod(rng: random.Random) -> dict[str, Any]:
    """A pod made from scratch: see the module docstring."""
    spec: dict[str, Any] = {"containers": [random_container(rng, f"c{i}")
                                           for i in range(rng.randint(1, 4))]}
    if rng.random() < 0.3:
        spec["initContainers"] = [random_container(rng, f"i{i}") for i in range(2)]
        if rng.random() < 0.5:
            spec["initContainers"][0]["restartPolicy"] = "Always"
    if rng.random() < 0.1:
        spec["nodeName"] = "node-1"
    if rng.random() < 0.1:
        spec["volumes"] = [{"name": "v", "hostPath": {"path": rng.choice(
            ["/var/run/egpu", "/run/egpu-node/x", "/", "/data"])}}]
    if rng.random() < 0.2:
        spec["schedulerName"] = rng.choice(["default-scheduler", "volcano", ""])
    keys = rng.sample(sorted(ANNOTATIONS), rng.randint(0, 3))
    metadata = {"name": "p", "namespace": "fuzz",
                "annotations": {k: rng.choice(ANNOTATIONS[k]) for k in keys}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def encode(value: Any, rng: random.Random) -> bytes:
    """JSON text of ``value`` with every ``Raw`` written as its text."""
    raws: list[str] = []

    def placeholder(item: Any) -> str:  # json.dumps calls it for each Raw, in text order
        if not isinstance(item, Raw):
            raise TypeError(type(item).__name__)
        raws.append(item.text)
        return RAW

    try:
        text = json.dumps(value, default=placeholder)
    except (RecursionError, ValueError):  # nested deeper than the encoder allows
        raws.clear()
        text = json.dumps(admission_review(random_pod(rng), "deep"))
    for raw in raws:
        text = text.replace(f'"{RAW}"', raw, 1)
    return text.encode("utf-8", "surrogateescape")


def envelope_body(pod: dict[str, Any], uid: str, rng: random.Random) -> tuple[bytes, bool]:
    """A review whose envelope is wrong in one way; ``(body, envelope_valid)``."""
    review = admission_review(pod, uid)
    request = review["request"]
    pick = rng.randrange(12)
    if pick == 0:
        del review["request"]
    elif pick == 1:
        del request["uid"]
    elif pick == 2:
        request["uid"] = rng.choice([7, None, "", [uid], {"u": uid}])
    elif pick == 3:
        review["apiVersion"] = rng.choice(["admission.k8s.io/v2", "v1", 1, None])
    elif pick == 4:
        review["kind"] = rng.choice(["Pod", "AdmissionRequest", None, 7])
    elif pick == 5:
        review["request"] = rng.choice([None, [], "x", 7])
    elif pick == 6:
        request["object"] = rng.choice([None, [], "x", 7])
    elif pick == 7:
        request["operation"] = rng.choice(["UPDATE", "DELETE", None, 7, "create"])
        return json.dumps(review).encode(), request["operation"] in ("UPDATE", "DELETE")
    elif pick == 8:
        request["kind"] = rng.choice([None, "Pod", {"group": "apps", "kind": "Deployment"},
                                      {"kind": 7}])
    elif pick == 9:
        request["namespace"] = rng.choice([None, 7, ["a"], "kube-system", ""])
        return json.dumps(review).encode(), True
    elif pick == 10:
        review["apiVersion"] = "admission.k8s.io/v1beta1"
        return json.dumps(review).encode(), True
    else:
        request["subResource"] = rng.choice(["status", 7, ["x"]])
    return json.dumps(review).encode(), False


def broken_body(pod: dict[str, Any], rng: random.Random) -> bytes:
    """Not an AdmissionReview at all: truncated, another JSON type, not JSON, empty."""
    pick = rng.randrange(8)
    text = json.dumps(admission_review(pod, "cut")).encode()
    if pick == 0:
        return text[:rng.randrange(len(text))]
    if pick == 1:
        return json.dumps(rng.choice([[], [1, 2], 7, "x", None, True, 1.5])).encode()
    if pick == 2:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))
    if pick == 3:
        return b""
    if pick == 4:
        return rng.choice([b"\xff\xfe{}", b"{\"apiVersion\": \"\xc3\x28\"}", b"\x00" * 20])
    if pick == 5:
        return rng.choice([b"not json", b"<xml/>", b"apiVersion: admission.k8s.io/v1",
                           b"{'a': 1}", b"{\"a\":}", b"[[[[", b"NaN"])
    if pick == 6:
        return text + b"garbage"
    return b" " * rng.randint(1, 1000) + text


def huge_body(pod: dict[str, Any], rng: random.Random) -> bytes:
    """A huge body: long strings, many containers, deep nesting, over the size limit."""
    pick = rng.randrange(5)
    if pick == 0:
        pod.setdefault("metadata", {}).setdefault("annotations", {})["big"] = "x" * (3 << 20)
    elif pick == 1:
        containers = pod.get("spec", {}).get("containers") or [{"name": "c"}]
        pod["spec"]["containers"] = [containers[0]] * 5000
    elif pick == 2:
        depth = rng.choice([2000, 100_000])
        text = json.dumps(admission_review(pod, "deep"))
        nested = "[" * depth + "]" * depth
        return text.replace('"namespace": "fuzz"', f'"namespace": "fuzz", "x": {nested}',
                            1).encode()
    elif pick == 3:
        return b"{" + b" " * (MAX_BODY_BYTES + 1024) + b"}"
    else:
        pod["spec"]["x"] = ["egpu.io/gpu"] * 200_000
    return json.dumps(admission_review(pod, f"huge-{pick}")).encode()


@dataclass
class Body:
    """One body to send: its bytes, its kind, and the uid a valid envelope carries."""

    data: bytes
    kind: str
    uid: str | None


def make_body(index: int, pods: list[str], rng: random.Random) -> Body:
    """Body number ``index`` (the mix of the module docstring); ``pods``: the input pods as
    JSON text."""
    uid = f"fuzz-{index}"
    roll = rng.random()
    base = json.loads(rng.choice(pods)) if pods else random_pod(rng)
    if roll < 0.001:
        return Body(huge_body(base, rng), "huge", None)
    if roll < 0.05:
        return Body(json.dumps(admission_review(base, uid)).encode(), "input", uid)
    if roll < 0.70:
        for _ in range(rng.randint(1, 3)):
            mutate(base, rng)
        if rng.random() < 0.1:  # last: later mutations would change every repeat at once
            repeat_container(base, rng)
        return Body(encode(admission_review(base, uid), rng), "mutated", uid)
    if roll < 0.85:
        return Body(json.dumps(admission_review(random_pod(rng), uid)).encode(), "random", uid)
    if roll < 0.95:
        data, valid = envelope_body(base, uid, rng)
        return Body(data, "envelope", uid if valid else None)
    return Body(broken_body(base, rng), "broken", None)


# --- judging answers -------------------------------------------------------------------------


def problems(message: str) -> list[str]:
    """The problems of a denial message (joined with "; "); a piece that says no "is not
    allowed" (a problem's own "; allowed: ..." or "; remove it") belongs to the one before."""
    out: list[str] = []
    for piece in message.split("; "):
        if out and " is not allowed" not in piece and not MORE_PROBLEMS.match(piece):
            out[-1] += "; " + piece
        else:
            out.append(piece)
    return out


@dataclass
class Tally:
    """What the run saw; ``failures`` keeps a few examples of each kind of failure."""

    sent: int = 0
    http_5xx: int = 0
    internal_errors: int = 0
    crashes: int = 0
    hangs: int = 0
    unnamed_denials: int = 0
    bad_answers: int = 0
    transport_errors: int = 0
    kinds: collections.Counter[str] = field(default_factory=collections.Counter)
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    latencies: list[float] = field(default_factory=list)
    failures: dict[str, list[str]] = field(default_factory=dict)

    def fail(self, what: str, body: Body, detail: str) -> None:
        """Keep up to three examples of a failure of kind ``what``."""
        examples = self.failures.setdefault(what, [])
        if len(examples) < 3:
            examples.append(f"[{body.kind}] {detail[:300]} <- {body.data[:200]!r}")

    @property
    def failed(self) -> int:
        """Every count that must be 0, added up."""
        return (self.http_5xx + self.internal_errors + self.crashes + self.hangs
                + self.unnamed_denials + self.bad_answers + self.transport_errors)


def judge(status: int, payload: bytes, body: Body, tally: Tally) -> None:
    """Count one answer (see the module docstring)."""
    if status >= 500:
        tally.http_5xx += 1
        tally.fail("http_5xx", body, f"HTTP {status}: {payload[:200]!r}")
        return
    try:
        answer = json.loads(payload)
    except ValueError:
        tally.bad_answers += 1
        tally.fail("bad_answers", body, f"HTTP {status}, not JSON: {payload[:200]!r}")
        return
    if status != 200:
        tally.outcomes[f"http_{status}"] += 1
        reason = answer.get("reason") if isinstance(answer, dict) else None
        if not isinstance(reason, str) or not NAMED_REASON.match(reason):
            tally.unnamed_denials += 1
            tally.fail("unnamed_denials", body, f"HTTP {status}: {reason!r}")
        return
    _judge_review(answer, body, tally)


def _judge_review(answer: Any, body: Body, tally: Tally) -> None:
    response = answer.get("response") if isinstance(answer, dict) else None
    if (not isinstance(response, dict) or answer.get("kind") != "AdmissionReview"
            or (body.uid is not None and response.get("uid") != body.uid)):
        tally.bad_answers += 1
        tally.fail("bad_answers", body, f"not an answer to uid {body.uid}: {answer!r}")
        return
    if "patch" in response:
        try:
            json.loads(base64.b64decode(response["patch"], validate=True))
        except ValueError:
            tally.bad_answers += 1
            tally.fail("bad_answers", body, f"patch is not base64 JSON: {response['patch']!r}")
    if response.get("allowed") is True:
        tally.outcomes["patched" if "patch" in response else "allowed"] += 1
        return
    tally.outcomes["denied"] += 1
    status = response.get("status") or {}
    message = str(status.get("message", ""))
    if status.get("code") == 500 or "internal error" in message:
        tally.internal_errors += 1
        tally.fail("internal_errors", body, message)
        return
    unnamed = [p for p in problems(message)
               if not NAMED_PROBLEM.match(p) and not MORE_PROBLEMS.match(p)]
    if unnamed or not message:
        tally.unnamed_denials += 1
        tally.fail("unnamed_denials", body, unnamed[0] if unnamed else "(no message)")


# --- the webhook process ---------------------------------------------------------------------


def start_webhook(webhook: WebhookProcess) -> None:
    """Start it (again) and wait (30 s at most) until /healthz answers. Raises SystemExit."""
    try:
        webhook.start()
    except DevClusterError as exc:
        raise SystemExit(f"admission_fuzz: the webhook did not start: {exc}") from None


# --- the run ---------------------------------------------------------------------------------


@dataclass
class Options:
    """The run's settings (see ``--help``)."""

    reviews: int
    concurrency: int
    max_seconds: float
    hang_seconds: float
    seed: int


async def _send(session: aiohttp.ClientSession, url: str, body: Body, hang_s: float,
                tally: Tally, webhook: WebhookProcess, restart: Callable[[], Any]) -> None:
    headers = {"Content-Type": "application/json"}
    started = time.perf_counter()
    try:
        async with asyncio.timeout(hang_s):
            async with session.post(url, data=body.data, headers=headers) as resp:
                payload = await resp.read()
                status = resp.status
    except TimeoutError:
        tally.hangs += 1
        tally.fail("hangs", body, f"no answer within {hang_s} s")
        return
    except aiohttp.ClientError as exc:
        if not webhook.alive():
            await restart()
            return
        if len(body.data) > MAX_BODY_BYTES:
            tally.outcomes["closed_over_limit"] += 1  # refused before the body was read
            return
        tally.transport_errors += 1
        tally.fail("transport_errors", body, repr(exc))
        return
    tally.latencies.append(time.perf_counter() - started)
    judge(status, payload, body, tally)


async def run(options: Options, webhook: WebhookProcess, pods: list[str]) -> tuple[Tally, float]:
    """Send the bodies; returns the tally and the seconds the sending took."""
    tally = Tally()
    rng = random.Random(options.seed)
    context = ssl.create_default_context(cafile=str(webhook.certs / "ca.crt"))
    connector = aiohttp.TCPConnector(ssl=context, limit=options.concurrency)
    url = f"https://127.0.0.1:{webhook.port}/mutate"
    lock = asyncio.Lock()
    started = time.perf_counter()
    deadline = started + options.max_seconds
    next_report = started + 30

    async def restart() -> None:
        async with lock:
            if not webhook.alive():
                tally.crashes += 1
                print(f"the webhook died (exit {webhook.returncode}); restarting", flush=True)
                await asyncio.to_thread(start_webhook, webhook)

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal next_report
        while tally.sent < options.reviews and time.perf_counter() < deadline:
            index = tally.sent
            tally.sent += 1
            body = make_body(index, pods, rng)
            tally.kinds[body.kind] += 1
            await _send(session, url, body, options.hang_seconds, tally, webhook, restart)
            if time.perf_counter() > next_report:
                next_report += 30
                print(f"  {tally.sent} sent, {time.perf_counter() - started:.0f} s, "
                      f"failures so far {tally.failed}", flush=True)

    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(worker(session) for _ in range(options.concurrency)))
    elapsed = time.perf_counter() - started
    if not webhook.alive():
        tally.crashes += 1
    return tally, elapsed


def report(tally: Tally, elapsed: float, options: Options, log_path: Path) -> int:
    """Print the details and the last line; the exit status."""
    lat = sorted(tally.latencies) or [0.0]
    print(f"bodies: {dict(sorted(tally.kinds.items()))}")
    print(f"answers: {dict(sorted(tally.outcomes.items()))}")
    print(f"latency: p50 {lat[len(lat) // 2] * 1000:.1f} ms, p99 "
          f"{lat[int(len(lat) * 0.99)] * 1000:.1f} ms, max {lat[-1] * 1000:.1f} ms; "
          f"{options.concurrency} concurrent, load average {os.getloadavg()[0]:.1f}")
    print(f"bad_answers={tally.bad_answers} transport_errors={tally.transport_errors}")
    for what, examples in sorted(tally.failures.items()):
        for example in examples:
            print(f"FAIL {what}: {example}")
    if tally.internal_errors or tally.crashes:
        print(f"webhook log: {log_path}")
    complete = tally.sent >= options.reviews
    if not complete:
        print(f"stopped at --max-seconds {options.max_seconds:g}: {tally.sent} of "
              f"{options.reviews} reviews sent")
    print(f"reviews={tally.sent} http_5xx={tally.http_5xx} "
          f"internal_errors={tally.internal_errors} crashes={tally.crashes} "
          f"hangs={tally.hangs} unnamed_denials={tally.unnamed_denials} "
          f"reviews_per_s={tally.sent / elapsed if elapsed else 0:.0f}")
    return 0 if complete and not tally.failed else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reviews", type=int, default=100_000, help="bodies to send")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    parser.add_argument("--max-seconds", type=float, default=1200.0,
                        help="stop sending after this many seconds")
    parser.add_argument("--hang-seconds", type=float, default=5.0,
                        help="an answer slower than this is a hang")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the bodies")
    parser.add_argument("--inputs", type=Path, default=SHARED / "inputs" / "pods",
                        help="folder of pod YAML files to mutate")
    args = parser.parse_args(argv)
    pods = load_pods(args.inputs) if args.inputs.is_dir() else []
    if not pods:
        print(f"no pod inputs at {args.inputs}: only pods made from scratch are mutated")
    options = Options(args.reviews, args.concurrency, args.max_seconds, args.hang_seconds,
                      args.seed)
    print(f"cpus: {os.cpu_count()}, {len(pods)} input pods, {options.reviews} reviews, "
          f"{options.concurrency} concurrent, seed {options.seed}", flush=True)
    with tempfile.TemporaryDirectory(prefix="egpu-fuzz-") as tmp:
        certs = Path(tmp)
        ca = create_ca()
        write_bundle(certs, ca, create_serving(ca, ["127.0.0.1", "localhost"]))
        log_path = Path(tempfile.gettempdir()) / f"egpu-admission-fuzz-{os.getpid()}.log"
        webhook = WebhookProcess(certs, log=log_path)
        start_webhook(webhook)
        try:
            tally, elapsed = asyncio.run(run(options, webhook, [json.dumps(p) for p in pods]))
        finally:
            webhook.stop()
    status = report(tally, elapsed, options, log_path)
    if not (tally.internal_errors or tally.crashes):
        log_path.unlink(missing_ok=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
