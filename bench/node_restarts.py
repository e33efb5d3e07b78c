"""Node restarts under share pod churn: the node agent, the kubelet and containerd of a real
node restarted at random moments while share pods come and go (issue 15's last figure).

On a real node (kubelet v1.37.2 + containerd 2.x + runc, the fake GPU's two 81559 MiB cards;
devcluster.realnode) with egpu installed by ``kubectl apply -k`` (as tests/e2e does:
tests/e2e/realnode_install.py), ``--workers`` threads each create a share pod (one
``egpu.io/gpu``, ``egpu.io/gpu-memory`` drawn from ``--sizes``, 5% compute; the container runs
the probe of demo/real_node.py: what CUDA and NVML show from inside, and whether one MiB more
is refused; here it also frees its memory on SIGTERM, see PROBE), wait for the probe's line
(or give up), judge it, delete the pod, follow it until it is gone, and create the next,
until the rounds are over. Each of ``--rounds`` rounds restarts, in a random order and each
after a random pause of up to ``--gap`` seconds: the node agent (its pod deleted: the
DaemonSet makes a new one), the kubelet and containerd (``devcluster.realnode.restart_part``,
as ``systemctl restart`` would); then waits until the node serves again (Ready, every egpu
part rolled out, one agent, the device plugin's slots in a status written after the new agent
became Ready). A sampler reads the cards' bookings every ``--sample-every`` seconds.

Every pod ends in exactly one of:
- ``ok``: the probe saw exactly its share (CUDA and NVML totals), could allocate all of it
  (less the interposer's context overhead), and one MiB more was refused;
- ``wrong_share``: the probe saw another total, a CUDA or NVML call failed, or one MiB past
  the whole share was not refused (must be 0);
- ``short_share``: the totals were right but less than the share was free in the new
  container (the card itself could not hold the share: memory in use beyond the bookings)
  (must be 0);
- ``missing_share``: the container ran without the interposer (/etc/ld.so.preload) or without
  its config (/run/egpu/config.json) (must be 0);
- ``refused``: the pod failed before its container ran, with its reason in its status (the
  kubelet refused it at admission: UnexpectedAdmissionError while the device plugin was away,
  or egpu's Allocate refusal); a controller would replace it, and the worker creates the next
  pod; the reasons are printed;
- ``not_started``: no probe result within ``--pod-timeout`` seconds: stuck (pending, or its
  container refused at every restart: a crash loop); the reasons are printed (must be 0). The
  result is the probe's log line, or, for a container running without one for 20 s (a
  containerd restart can cut its output from its log), its file in the container.

And over the run:
- ``overbooked``: card samples whose bookings exceed the card's memory (none of these pods
  asks for memory oversubscription), in either view: the pods' ``egpu.io/allocation`` records
  summed as ``kubectl egpu`` sums them (``egpu.cluster_view``), and the node agent's exporter
  (``egpu_card_memory_booked_bytes`` or the driver's ``..._used_bytes`` against
  ``..._total_bytes``) (must be 0);
- ``stuck_deleting``: the bench's pods still there ``DELETE_WAIT_S`` after the last delete;
- ``leaked_files``: deleted pods whose files (``/var/run/egpu``, ``/var/run/egpu-node``) are
  still on the node ``LEAK_WAIT_S`` after the pod is gone; ``leaked_mib``: MiB the agent
  still books then beyond the node's live pods' allocations (all three must be 0);
- ``killed``: started containers that did not end on SIGTERM (SIGKILLed), a test-bed figure;
- ``fake_leaked_mib``: the fake driver's memory in use after the run less before. The fake,
  as the driver, frees a process's memory when the process is gone, so this is memory that a
  process still holds after its pod was deleted (must be 0);
- ``settled_pods``, ``settled_ok``: once the last round's node serves again, each worker goes
  on until it has judged a pod created after that; those pods must all be ``ok`` (a refusal
  or a wrong share then is egpu's, not the restart's). Without this, a short run could end
  with only the refusals of the restarts and prove nothing of the node after them.

    .venv/bin/python bench/node_restarts.py [--rounds 6] [--workers 6] [--seed 15] [--state-dir DIR]
    .venv/bin/python bench/node_restarts.py --attach --state-dir DIR --node NAME --rounds 1

Without ``--attach`` it starts a private dev cluster in ``--state-dir`` (default: a new
temporary folder) with one real node, installs egpu, and removes everything at the end. With
``--attach`` it uses the cluster there as it is (egpu installed, the real node ``--node``
running: the e2e fixture's), and leaves it serving. Needs root.

Last line: ``rounds=N pods=N restarts_agent=N restarts_kubelet=N restarts_containerd=N
wrong_share=N missing_share=N not_started=N refused=N overbooked=N ok=N short_share=N
stuck_deleting=N
leaked_files=N leaked_mib=N killed=N fake_leaked_mib=N container_restarts=N samples=N
settled_pods=N settled_ok=N start_s_p50=N start_s_max=N recover_s_max=N`` (``start_s``: from
a pod's creation to its probe's line, pods that started; ``recover_s``: from a round's last
restart until the node serves again). Exit status 0 when wrong_share, missing_share,
not_started, overbooked, short_share, stuck_deleting, leaked_files, leaked_mib and
fake_leaked_mib are 0, at least one pod ran (ok), every settled pod is ok and no worker failed
(refused is reported with its reasons, see docs/benchmarks.md "Node restarts").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devcluster import cluster as devcluster  # noqa: E402
from devcluster import images as devimages  # noqa: E402
from devcluster import realnode  # noqa: E402
from egpu.cluster_view import cluster_view  # noqa: E402
from egpu.config import Config, load_config  # noqa: E402
from egpu.contract import RES_CORES, RES_GPU, RES_MEMORY  # noqa: E402
from scheduler.kube import ApiStatusError, RawApi  # noqa: E402
from testbed import realnode_install as inst  # noqa: E402

NODE = "egpu-real-restarts"
NS = "egpu-restarts"
LABEL = "egpu-bench=node-restarts"
# Small enough that the cards' bookings stay well below their memory: this bench judges
# restarts, bench/placement_chaos.py measures placement at capacity.
SIZES_MIB = (1000, 2000, 4096, 8000, 12000)
CORES = 5
PARTS = ("agent", "kubelet", "containerd")
AGENT_SELECTOR = "app.kubernetes.io/name=egpu-node-agent"
CUDA_ERROR_OUT_OF_MEMORY = 2
# What the interposer books per CUDA context out of the share (EGPU_CONTEXT_OVERHEAD_MIB,
# libinterpose/src/hooks_ctx.c): a new container sees share - this free.
CONTEXT_OVERHEAD_MIB = 256
CALLS = ("init", "device", "ctx", "meminfo", "alloc_free", "nvml_init", "nvml_handle",
         "nvml_meminfo")
RECOVER_S = 240.0
DELETE_WAIT_S = 180.0
LEAK_WAIT_S = 60.0
DELETE_WATCH_S = 30.0
NOT_STARTED_PAUSE_S = 3.0
# beyond a pod's timeout and its delete: how long the workers may take, once the node serves
# again, to have each judged a pod created after that (s)
SETTLE_SLACK_S = 30.0
METRIC = re.compile(r"^egpu_card_memory_(total|booked|used)_bytes\{([^}]*)\} (\S+)$", re.M)
UUID = re.compile(r'UUID="([^"]*)"')
# The probe of demo/real_node.py: it frees what it allocated on SIGTERM (see there); one
# SIGKILLed anyway counts in ``killed``. The fake driver frees a dead process's memory, as the
# driver does, so ``fake_leaked_mib`` is memory a live process still holds after its pod went.
PROBE = inst.PROBE
OK, WRONG, MISSING, SHORT, NOT_STARTED, REFUSED = (
    "ok", "wrong_share", "missing_share", "short_share", "not_started", "refused")
KINDS = (OK, WRONG, MISSING, SHORT, NOT_STARTED, REFUSED)


@dataclass
class Cluster:
    """What tests/e2e/realnode_install's helpers use of the e2e fixture (``RealCluster``)."""

    info: devcluster.ClusterInfo
    node: realnode.RealNode

    @property
    def kubeconfig(self) -> str:
        return self.info.kubeconfig

    def kubectl(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        proc = subprocess.run(self.info.kubectl_argv(*args), capture_output=True, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n"
                                 f"{proc.stdout}{proc.stderr}")
        return proc.stdout

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = 60,
                 interval: float = 0.5) -> Any:
        return devcluster.wait_until(what, check, timeout, interval)


@dataclass
class Outcome:
    name: str
    mib: int
    kind: str
    detail: str = ""
    start_s: float | None = None
    restarts: int = 0
    uid: str = ""
    created_at: float = 0.0  # time.monotonic() when its create was sent
    worker: int = -1


@dataclass
class Tally:
    """What the threads found (under ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    outcomes: list[Outcome] = field(default_factory=list)
    restarts: Counter[str] = field(default_factory=Counter)
    samples: int = 0
    killed: int = 0
    overbooked: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)
        if outcome.kind != OK:
            print(f"  {outcome.kind}: {outcome.name} ({outcome.mib} MiB): {outcome.detail}",
                  flush=True)

    def count(self, kind: str) -> int:
        with self.lock:
            return sum(1 for o in self.outcomes if o.kind == kind)

    def snapshot(self) -> list[Outcome]:
        with self.lock:
            return list(self.outcomes)


def created_since(outcomes: list[Outcome], since: float) -> list[Outcome]:
    """The outcomes of the pods created at or after ``since`` (time.monotonic())."""
    return [o for o in outcomes if o.created_at >= since]


def workers_without(outcomes: list[Outcome], since: float, workers: int) -> set[int]:
    """The workers (0..workers-1) with no judged pod created at or after ``since``."""
    return set(range(workers)) - {o.worker for o in created_since(outcomes, since)}


# --- the share pods ---------------------------------------------------------------------------


def share_pod(name: str, mib: int) -> dict[str, Any]:
    """A pod of one ``mib`` share on the real node, running the probe (small cpu and memory:
    the node has 2 cores, egpu's own pods take about 1.5)."""
    key, _, value = LABEL.partition("=")
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {key: value}},
        "spec": {
            "nodeSelector": {inst.REAL_LABEL: "true"},
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "probe", "image": devimages.IMAGE_EGPU,
                "command": ["python3", "-c", PROBE],
                "resources": {"limits": {RES_GPU: "1", RES_MEMORY: str(mib),
                                         RES_CORES: str(CORES), "cpu": inst.PROBE_CPU,
                                         "memory": inst.PROBE_MEMORY}},
            }],
        },
    }


def judge(result: dict[str, Any], mib: int) -> tuple[str, str]:
    """(kind, detail) of a probe's result for a share of ``mib``: missing_share (no
    interposer or config), wrong_share (a total not the share, a CUDA or NVML call failed, or
    one MiB past the whole share not refused), short_share (less than the share free in a new
    container: the card itself could not hold it), else ok."""
    if not str(result.get("preload", "")).endswith("libegpu_interpose.so") \
            or result.get("config") is not True:
        return MISSING, f"preload={result.get('preload')!r} config={result.get('config')}"
    failed = {c: result.get(c) for c in CALLS if c != "alloc_free" and result.get(c) != 0}
    short = result.get("alloc_free") != 0 \
        or int(result.get("free_mib") or 0) < mib - CONTEXT_OVERHEAD_MIB
    wrong = []
    if failed:
        wrong.append(f"calls {failed}")
    if result.get("total_mib") != mib or result.get("nvml_total_mib") != mib:
        wrong.append(f"total {result.get('total_mib')} MiB, NVML {result.get('nvml_total_mib')}"
                     f" MiB (share {mib})")
    if not short and result.get("alloc_one_more_mib") != CUDA_ERROR_OUT_OF_MEMORY:
        wrong.append(f"one MiB past the share: {result.get('alloc_one_more_mib')}")
    if wrong:
        return WRONG, "; ".join(wrong)
    if short:
        return SHORT, (f"{result.get('free_mib')} of {mib} MiB free at start, allocating it: "
                       f"{result.get('alloc_free')}")
    return OK, ""


def probe_file(info: devcluster.ClusterInfo, name: str) -> dict[str, Any] | None:
    """The probe's result from its file in the container (kubectl exec): for a container
    whose log line a containerd restart cut (testbed.realnode_install.probe_result)."""
    def kubectl(*args: str) -> str:
        return subprocess.run(info.kubectl_argv(*args), capture_output=True, text=True,
                              timeout=30, check=False).stdout

    return inst.read_probe_file(kubectl, NS, name)


def probe_line(api: RawApi, name: str) -> dict[str, Any] | None:
    try:
        text = api.open("GET", f"/api/v1/namespaces/{NS}/pods/{name}/log",
                        timeout=10).read().decode("utf-8", "replace")
    except Exception:  # the kubelet restarting, the container not there yet
        return None
    for line in text.splitlines():
        if line.startswith("PROBE "):
            return dict(json.loads(line[len("PROBE "):]))
    return None


def why_not_started(api: RawApi, pod: dict[str, Any] | None) -> str:
    """The pod's state in a few words: phase, reason, waiting container, last warning."""
    if pod is None:
        return "pod not found"
    status = pod.get("status", {})
    words = [str(status.get("phase", "?"))]
    if status.get("reason"):
        words.append(f"{status['reason']}: {status.get('message', '')}".strip())
    if not pod["spec"].get("nodeName"):
        cond: dict[str, Any] = next(
            (c for c in status.get("conditions", []) if c["type"] == "PodScheduled"), {})
        words.append(f"unscheduled: {cond.get('message', 'not bound')}")
    for cs in status.get("containerStatuses", []):
        for state, info in cs.get("state", {}).items():
            if state != "running" and info.get("reason"):
                words.append(f"container {state} {info['reason']}: {info.get('message', '')}"
                             .strip())
    with contextlib.suppress(Exception):
        events = api.json("GET", f"/api/v1/namespaces/{NS}/events", query={
            "fieldSelector": f"involvedObject.name={pod['metadata']['name']},type=Warning"})
        items = sorted(events.get("items", []),
                       key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        if items:
            words.append(f"event {items[-1].get('reason')}: {items[-1].get('message', '')}")
    return "; ".join(words)[:600]


def reason_of(detail: str) -> str:
    """The kind of a not-started pod's reason, for the summary."""
    if "does not match" in detail and "NVIDIA_VISIBLE_DEVICES" in detail:
        return ("the hook refused: the kubelet gave the container another card than its "
                "allocation (docs/node.md, GetPreferredAllocation)")
    if "egpu:" in detail:
        return "the hook refused: " + detail.split("egpu:", 1)[1].split(";")[0].strip()[:120]
    if "UnexpectedAdmissionError" in detail:
        return ("the kubelet refused it at admission: the device plugin was not registered "
                "(UnexpectedAdmissionError)")
    if "Insufficient egpu.io/gpu" in detail:
        return ("pending: the kube-scheduler found no egpu.io/gpu slots (0 while the device "
                "plugin was away) and did not try again in time")
    return detail[:120]


def run_pod(api: RawApi, name: str, mib: int, timeout_s: float,
            info: devcluster.ClusterInfo | None = None) -> Outcome:
    """Create the pod, wait for its probe's line (or give up), judge it."""
    t0 = time.monotonic()
    try:
        created = api.json("POST", f"/api/v1/namespaces/{NS}/pods", body=share_pod(name, mib))
    except ApiStatusError as exc:
        time.sleep(1.0)
        return Outcome(name, mib, NOT_STARTED, f"create refused: {exc}", created_at=t0)
    uid = str(created["metadata"]["uid"])
    pod: dict[str, Any] | None = created
    pacer = inst.ProbeFilePacer()  # from when the container is first seen running
    while time.monotonic() - t0 < timeout_s:
        time.sleep(1.0)
        try:
            pod = api.json("GET", f"/api/v1/namespaces/{NS}/pods/{name}")
        except Exception:
            continue
        assert pod is not None
        statuses = pod.get("status", {}).get("containerStatuses", [])
        restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
        ran = any("running" in s.get("state", {}) or "terminated" in s.get("state", {})
                  or s.get("restartCount") for s in statuses)
        if ran:
            result = probe_line(api, name)
            now = time.monotonic()
            pacer.start(now)
            if result is None and info is not None and pacer.due(now):
                result = probe_file(info, name)
            if result is not None:
                kind, detail = judge(result, mib)
                if kind == SHORT:
                    detail += f"; the fake cards now: {describe_cards(fake_cards(api))}"
                return Outcome(name, mib, kind, detail, time.monotonic() - t0, restarts, uid,
                               t0)
        if pod.get("status", {}).get("phase") in ("Failed", "Succeeded"):
            status = pod.get("status", {})
            kind = REFUSED if status.get("reason") and status.get("message") else NOT_STARTED
            return Outcome(name, mib, kind, why_not_started(api, pod), None, restarts, uid, t0)
    return Outcome(name, mib, NOT_STARTED,
                   f"no probe output in {timeout_s:.0f} s: {why_not_started(api, pod)}",
                   None, 0, uid, t0)


def delete_pod(api: RawApi, name: str) -> None:
    with contextlib.suppress(Exception):
        api.json("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}",
                 query={"gracePeriodSeconds": 1})


def delete_and_watch(api: RawApi, name: str, timeout_s: float = DELETE_WATCH_S) -> str:
    """Delete the pod and follow it until it is gone (at most ``timeout_s``); "" when its
    container ended by itself on SIGTERM, else how it ended (exit code and what the probe's
    SIGTERM handler had noted in /dev/termination-log)."""
    delete_pod(api, name)
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            pod = api.json("GET", f"/api/v1/namespaces/{NS}/pods/{name}")
        except ApiStatusError as exc:
            if exc.status == 404:
                break
            continue
        except Exception:
            continue
        for cs in pod.get("status", {}).get("containerStatuses", []):
            last = cs.get("state", {}).get("terminated") or last
        time.sleep(0.5)
    else:
        return f"still there {timeout_s:.0f} s after the delete"
    if not last or last.get("exitCode") == 0:
        return ""
    return (f"exit {last.get('exitCode')} ({last.get('reason')}), the probe's note: "
            f"{last.get('message', '').strip() or 'none (no SIGTERM seen)'}")


def churn(info: devcluster.ClusterInfo, worker: int, seed: int, sizes: tuple[int, ...],
          stop: threading.Event, tally: Tally, timeout_s: float) -> None:
    """One worker: pods one after another until ``stop``."""
    rng = random.Random(f"{seed}-{worker}")
    api = RawApi(info.api_client())
    n = 0
    try:
        while not stop.is_set():
            name = f"w{worker}-p{n:04d}"
            n += 1
            outcome = run_pod(api, name, rng.choice(sizes), timeout_s, info)
            outcome.worker = worker
            tally.add(outcome)
            ended = delete_and_watch(api, name)
            if ended and outcome.start_s is not None:
                with tally.lock:
                    tally.killed += 1
                print(f"  killed: {name} ({outcome.mib} MiB): {ended}", flush=True)
            if outcome.kind in (NOT_STARTED, REFUSED):
                # a pod refused at once (the kubelet without the device plugin): the next
                # one a little later, not one every second of the outage
                stop.wait(NOT_STARTED_PAUSE_S)
    except Exception as exc:  # noted, and the run fails: a worker must not die silently
        with tally.lock:
            tally.errors.append(f"worker {worker}: {exc!r}")
    finally:
        api.client.close()


# --- the bookings -------------------------------------------------------------------------


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=3) as resp:
        return str(resp.read().decode())


def agent_cards(text: str) -> dict[str, dict[str, float]]:
    """{card UUID: {total, booked, used: bytes}} from the exporter's text."""
    cards: dict[str, dict[str, float]] = {}
    for kind, labels, value in METRIC.findall(text):
        uuid = UUID.search(labels)
        if uuid:
            cards.setdefault(uuid[1], {})[kind] = float(value)
    return cards


def running_agents(api: RawApi) -> list[dict[str, Any]]:
    pods = api.json("GET", f"/api/v1/namespaces/{inst.NAMESPACE}/pods",
                    query={"labelSelector": AGENT_SELECTOR})["items"]
    return [p for p in pods if p.get("status", {}).get("phase") == "Running"
            and p["status"].get("podIP") and not p["metadata"].get("deletionTimestamp")]


def node_pods(api: RawApi, node: str) -> list[dict[str, Any]]:
    return list(api.json("GET", "/api/v1/pods",
                         query={"fieldSelector": f"spec.nodeName={node}"})["items"])


def overbooked_now(api: RawApi, node: str, config: Config) -> list[str]:
    """The cards booked past their memory now, in the records' view and the agent's."""
    found = []
    node_obj = api.json("GET", f"/api/v1/nodes/{node}")
    for view in cluster_view([node_obj], node_pods(api, node), config):
        for card in view.cards:
            if card.booked_mib > card.card.memory_mib:
                found.append(f"records: {card.card.uuid} {card.booked_mib} MiB booked of "
                             f"{card.card.memory_mib} ({len(card.shares)} shares)")
    for agent in running_agents(api):
        try:
            text = scrape(f"http://{agent['status']['podIP']}:9400/metrics")
        except OSError:
            continue  # restarting
        for uuid, m in agent_cards(text).items():
            total = m.get("total", 0.0)
            for kind in ("booked", "used"):
                if total and m.get(kind, 0.0) > total:
                    found.append(f"agent {kind}: {uuid} {m[kind] / 2**20:.0f} MiB of "
                                 f"{total / 2**20:.0f}")
    return found


def sampler(info: devcluster.ClusterInfo, node: str, config: Config, every_s: float,
            stop: threading.Event, tally: Tally) -> None:
    api = RawApi(info.api_client())
    try:
        while not stop.wait(every_s):
            try:
                found = overbooked_now(api, node, config)
            except Exception:  # an API hiccup: no sample
                continue
            with tally.lock:
                tally.samples += 1
                tally.overbooked += len(found)
            for line in found:
                print(f"  overbooked: {line}", flush=True)
    finally:
        api.client.close()


# --- restarts and recovery ----------------------------------------------------------------


def restart(cluster: Cluster, api: RawApi, part: str) -> None:
    if part == "agent":
        for agent in running_agents(api):
            api.json("DELETE", f"/api/v1/namespaces/{inst.NAMESPACE}/pods/"
                     f"{agent['metadata']['name']}")
    else:
        cluster.node = realnode.restart_part(cluster.info.state_dir, cluster.node.name, part)


def recover(cluster: Cluster, api: RawApi) -> float:
    """Seconds until the node serves again: Ready, every egpu part rolled out, one agent, the
    device plugin's slots in a status written after the agent became Ready."""
    t0 = time.monotonic()

    def node_ready() -> bool:
        node = api.json("GET", f"/api/v1/nodes/{cluster.node.name}")
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in node["status"].get("conditions", []))

    cluster.wait_for("the real node Ready", node_ready, timeout=RECOVER_S, interval=1.0)
    # the old agent gone first: wait_slots reads the first agent pod it lists
    cluster.wait_for("one node agent, the old one gone", lambda: len(api.json(
        "GET", f"/api/v1/namespaces/{inst.NAMESPACE}/pods",
        query={"labelSelector": AGENT_SELECTOR})["items"]) == 1, timeout=RECOVER_S,
        interval=1.0)
    inst.wait_installed(cluster, timeout=RECOVER_S)
    return time.monotonic() - t0


# --- the end: deleted pods gone, nothing left behind --------------------------------------


def bench_pods(api: RawApi) -> list[dict[str, Any]]:
    return list(api.json("GET", f"/api/v1/namespaces/{NS}/pods",
                         query={"labelSelector": LABEL})["items"])


def wait_gone(api: RawApi) -> int:
    """Delete what is left of the bench's pods; how many are still there DELETE_WAIT_S on."""
    with contextlib.suppress(Exception):
        api.json("DELETE", f"/api/v1/namespaces/{NS}/pods",
                 query={"labelSelector": LABEL, "gracePeriodSeconds": 1})
    deadline = time.monotonic() + DELETE_WAIT_S
    left = bench_pods(api)
    while left and time.monotonic() < deadline:
        time.sleep(2)
        left = bench_pods(api)
    for pod in left:
        print(f"  stuck deleting: {pod['metadata']['name']}: "
              f"{why_not_started(api, pod)}", flush=True)
    return len(left)


def node_files(node: realnode.RealNode) -> list[str]:
    out: list[str] = []
    for top in ("/var/run/egpu", "/var/run/egpu-node"):
        root = node.host_path(top)
        with contextlib.suppress(OSError):
            out.extend(str(p) for p in root.rglob("*"))
    return out


def leaks(cluster: Cluster, api: RawApi, uids: set[str], config: Config) -> tuple[int, int]:
    """(pods whose files are still on the node, MiB the agent books beyond the live pods'
    records), each given up to LEAK_WAIT_S to settle."""
    deadline = time.monotonic() + LEAK_WAIT_S

    def leaked_files() -> set[str]:
        files = node_files(cluster.node)
        return {u for u in uids if u and any(u in f for f in files)}

    def leaked_mib() -> float:
        node_obj = api.json("GET", f"/api/v1/nodes/{cluster.node.name}")
        records = sum(c.booked_mib for v in cluster_view([node_obj], node_pods(
            api, cluster.node.name), config) for c in v.cards)
        booked = 0.0
        for agent in running_agents(api):
            cards = agent_cards(scrape(f"http://{agent['status']['podIP']}:9400/metrics"))
            booked += sum(m.get("booked", 0.0) for m in cards.values()) / 2**20
        return max(0.0, booked - records)

    files, mib = leaked_files(), leaked_mib()
    while (files or mib) and time.monotonic() < deadline:
        time.sleep(2)
        files, mib = leaked_files(), leaked_mib()
    for uid in sorted(files):
        print(f"  leaked files of pod {uid}: "
              f"{[f for f in node_files(cluster.node) if uid in f][:4]}", flush=True)
    return len(files), round(mib)


# --- setup ----------------------------------------------------------------------------------


def start_cluster(state_dir: Path) -> Cluster:
    """A private dev cluster with one real node and egpu installed (the e2e fixtures'
    ``real_cluster`` and ``installed``)."""
    realnode.remove_all(state_dir)
    devcluster.down(state_dir)
    info = devcluster.up(devcluster.Config(state_dir=state_dir, egpu_profile=False))
    cluster = Cluster(info, realnode.add(info, name=NODE))
    work = state_dir / "node-restarts"
    ca = inst.create_webhook_tls(cluster, work)
    cluster.kubectl("apply", "-k", str(inst.kustomization(work / "kustomize")), timeout=120)
    inst.inject_ca(cluster, ca)
    inst.wait_installed(cluster)
    return cluster


def stop_cluster(state_dir: Path) -> None:
    realnode.remove_all(state_dir)
    devcluster.down(state_dir)


def ensure_namespace(cluster: Cluster, api: RawApi) -> None:
    """The bench's namespace, made anew if an earlier run's is still being deleted."""
    def usable() -> bool:
        try:
            ns = api.json("GET", f"/api/v1/namespaces/{NS}")
        except ApiStatusError as exc:
            if exc.status != 404:
                raise
            with contextlib.suppress(ApiStatusError):
                api.json("POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
            return False
        return not ns["metadata"].get("deletionTimestamp")

    cluster.wait_for(f"namespace {NS}", usable, timeout=120, interval=1.0)

    def has_sa() -> bool:
        try:
            api.json("GET", f"/api/v1/namespaces/{NS}/serviceaccounts/default")
            return True
        except ApiStatusError:
            return False

    cluster.wait_for(f"service account {NS}/default", has_sa, timeout=60)


def fake_cards(api: RawApi) -> dict[str, tuple[int, int]]:
    """{card UUID: (MiB in use, MiB)} in the fake driver, as the node agent's exporter reads
    it (NVML); {} when no agent answers."""
    for agent in running_agents(api):
        with contextlib.suppress(OSError):
            cards = agent_cards(scrape(f"http://{agent['status']['podIP']}:9400/metrics"))
            return {uuid: (round(m.get("used", 0) / 2**20), round(m.get("total", 0) / 2**20))
                    for uuid, m in cards.items()}
    return {}


def describe_cards(cards: dict[str, tuple[int, int]]) -> str:
    return ", ".join(f"{uuid[-4:]}: {used} of {total} MiB"
                     for uuid, (used, total) in sorted(cards.items())) or "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--workers", type=int, default=6, help="pods at a time")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES_MIB)),
                    help="share sizes to draw from, MiB, comma-separated")
    ap.add_argument("--gap", type=float, default=12.0,
                    help="longest pause before each restart, seconds")
    ap.add_argument("--pod-timeout", type=float, default=120.0, help="seconds")
    ap.add_argument("--sample-every", type=float, default=2.0, help="seconds")
    ap.add_argument("--state-dir", type=Path, default=None,
                    help="the dev cluster's folder (default: a new temporary folder)")
    ap.add_argument("--attach", action="store_true",
                    help="use the cluster in --state-dir as it is (egpu installed)")
    ap.add_argument("--node", default=NODE, help="the real node (with --attach)")
    args = ap.parse_args(argv)
    if args.attach and args.state_dir is None:
        ap.error("--attach needs --state-dir")
    sizes = tuple(int(v) for v in args.sizes.split(","))
    t_start = time.monotonic()
    rng = random.Random(args.seed)
    state_dir = (args.state_dir or Path(tempfile.mkdtemp(prefix="egpu-restarts-"))).resolve()
    if args.attach:
        info = devcluster.ClusterInfo.load(state_dir)
        cluster = Cluster(info, realnode.RealNode.load(state_dir, args.node))
    else:
        print(f"starting a dev cluster with a real node in {state_dir}", flush=True)
        cluster = start_cluster(state_dir)
    api = RawApi(cluster.info.api_client())
    tally = Tally()
    recover_max = 0.0
    stuck = leaked_files = leaked_mib = 0
    fake_leaked: int | str = "unknown"
    stop = threading.Event()
    served_again = time.monotonic()
    settled: list[Outcome] = []
    try:
        ensure_namespace(cluster, api)
        fake_before = fake_cards(api)
        config = load_config(api.json(
            "GET", f"/api/v1/namespaces/{inst.NAMESPACE}/configmaps/egpu-config")["data"].get(
            "config.yaml"))
        print(f"set up in {time.monotonic() - t_start:.0f} s; {args.rounds} rounds, "
              f"{args.workers} pods at a time; the fake cards in use before: "
              f"{describe_cards(fake_before)}", flush=True)
        threads = [threading.Thread(target=churn, args=(cluster.info, w, args.seed, sizes, stop,
                                                        tally, args.pod_timeout), daemon=True)
                   for w in range(args.workers)]
        threads.append(threading.Thread(target=sampler, args=(
            cluster.info, cluster.node.name, config, args.sample_every, stop, tally),
            daemon=True))
        for t in threads:
            t.start()
        for r in range(args.rounds):
            t_round = time.monotonic()
            order = rng.sample(PARTS, len(PARTS))
            for part in order:
                time.sleep(rng.uniform(0, args.gap))
                restart(cluster, api, part)
                tally.restarts[part] += 1
            took = recover(cluster, api)
            served_again = time.monotonic()
            recover_max = max(recover_max, took)
            time.sleep(rng.uniform(0, args.gap))  # pods under a settled node, too
            print(f"round {r + 1}: restarted {', '.join(order)}; served again {took:.1f} s "
                  f"after the last; {time.monotonic() - t_round:.0f} s; pods so far "
                  f"{len(tally.outcomes)} (not started {tally.count(NOT_STARTED)})", flush=True)
        # every worker's next pod, created once the node served again, must start: the
        # outcomes of the restarts alone could all be refusals, and prove nothing of after
        settle_by = time.monotonic() + args.pod_timeout + DELETE_WATCH_S + SETTLE_SLACK_S
        while missing := workers_without(tally.snapshot(), served_again, args.workers):
            if time.monotonic() > settle_by:
                tally.errors.append(f"workers {sorted(missing)}: no pod created after the "
                                    f"node served again within {settle_by - served_again:.0f} s")
                break
            time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(timeout=args.pod_timeout + 60)
        settled = created_since(tally.snapshot(), served_again)
        stuck = wait_gone(api)
        leaked_files, leaked_mib = leaks(cluster, api, {o.uid for o in tally.outcomes}, config)
        fake_after = fake_cards(api)
        print(f"the fake cards in use after: {describe_cards(fake_after)}", flush=True)
        if fake_before and fake_after:
            fake_leaked = sum(u for u, _ in fake_after.values()) \
                - sum(u for u, _ in fake_before.values())
    finally:
        stop.set()
        if args.attach:
            with contextlib.suppress(Exception):
                wait_gone(api)
                api.json("DELETE", f"/api/v1/namespaces/{NS}")
            with contextlib.suppress(Exception):
                recover(cluster, api)
        api.client.close()
        if not args.attach:
            stop_cluster(state_dir)
    for error in tally.errors:
        print(f"  error: {error}", flush=True)
    outcomes = tally.outcomes
    for kind in (NOT_STARTED, REFUSED):
        reasons = Counter(reason_of(o.detail) for o in outcomes if o.kind == kind)
        for reason, n in reasons.most_common():
            print(f"{kind.replace('_', ' ')} x{n}: {reason}")
    starts = [o.start_s for o in outcomes if o.start_s is not None]
    counts = {k: sum(1 for o in outcomes if o.kind == k) for k in KINDS}
    print(f"wall {time.monotonic() - t_start:.0f} s")
    figures = {
        "rounds": args.rounds, "pods": len(outcomes),
        "restarts_agent": tally.restarts["agent"], "restarts_kubelet": tally.restarts["kubelet"],
        "restarts_containerd": tally.restarts["containerd"], "wrong_share": counts[WRONG],
        "missing_share": counts[MISSING], "not_started": counts[NOT_STARTED],
        "refused": counts[REFUSED],
        "overbooked": tally.overbooked, "ok": counts[OK], "short_share": counts[SHORT],
        "stuck_deleting": stuck, "leaked_files": leaked_files, "leaked_mib": leaked_mib,
        "killed": tally.killed, "fake_leaked_mib": fake_leaked,
        "container_restarts": sum(o.restarts for o in outcomes), "samples": tally.samples,
        "settled_pods": len(settled), "settled_ok": sum(1 for o in settled if o.kind == OK),
        "start_s_p50": f"{statistics.median(starts) if starts else 0:.1f}",
        "start_s_max": f"{max(starts, default=0):.1f}", "recover_s_max": f"{recover_max:.1f}",
    }
    print(" ".join(f"{k}={v}" for k, v in figures.items()))
    bad = (counts[WRONG] + counts[MISSING] + counts[SHORT] + counts[NOT_STARTED]
           + tally.overbooked + stuck + leaked_files + leaked_mib
           + (max(fake_leaked, 0) if isinstance(fake_leaked, int) else 0)
           + sum(1 for o in settled if o.kind != OK))
    return 0 if bad == 0 and counts[OK] and not tally.errors else 1


if __name__ == "__main__":
    sys.exit(main())
