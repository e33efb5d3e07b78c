"""The e2e fixture: a real local control plane (devcluster) with simulated GPU nodes.

``cluster`` (session scope) reuses a dev cluster that ``status`` reports up in the state
folder (${EGPU_STATE_DIR:-~/.cache/egpu/dev-cluster}), else starts one with the same code as
``egpu dev-cluster up``. A cluster a pytest session started is stopped when the last session
using it ends (leases, see below); one started by hand is left running.
It (re)creates the nodes of the shared cluster description either way, and waits until each
is Ready and free of the node lifecycle controller's ``node.kubernetes.io/not-ready`` taint
(``devcluster.nodes.create_nodes``), so no test races a node that is still being initialized.

Environment:
    EGPU_E2E_BUILD=0        skip e2e tests when the binaries are not built yet (default: build;
                            a cold build takes ~an hour on 2 cores, see docs/devcluster.md)
    EGPU_E2E_CLUSTER_FILE   cluster description (default ../shared/inputs/cluster.yaml)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devcluster import build as devbuild
from devcluster import cluster as devcluster
from devcluster import nodes as devnodes

REPO = Path(__file__).resolve().parents[2]


def _default_cluster_file() -> Path:
    for candidate in (
        REPO.parent / "shared" / "inputs" / "cluster.yaml",
        REPO / "shared" / "inputs" / "cluster.yaml",
        Path("/work/shared/inputs/cluster.yaml"),
    ):
        if candidate.exists():
            return candidate
    return REPO.parent / "shared" / "inputs" / "cluster.yaml"


CLUSTER_FILE = Path(os.environ.get("EGPU_E2E_CLUSTER_FILE") or _default_cluster_file())
INPUTS = CLUSTER_FILE.parent
NODES_READY_S = 120.0  # a loaded 2-core machine can take a while to mark new nodes Ready


@dataclass
class E2ECluster:
    """What e2e tests get: paths, URLs, a client factory and a kubectl runner."""

    info: devcluster.ClusterInfo
    node_names: list[str]
    inputs: Path
    started_here: bool
    _clients: list[Any] = field(default_factory=list)

    @property
    def kubeconfig(self) -> str:
        return self.info.kubeconfig

    @property
    def server(self) -> str:
        return self.info.server

    def api_client(self) -> Any:
        """A new kubernetes.client.ApiClient (closed at the end of the session)."""
        client = self.info.api_client()
        self._clients.append(client)
        return client

    def kubectl(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        proc = subprocess.run(
            self.info.kubectl_argv(*args), capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )
        return proc.stdout

    def wait_for(
        self, what: str, check: Callable[[], Any], timeout: float = 60, interval: float = 0.5
    ) -> Any:
        """Poll ``check()`` until truthy; fail naming ``what``."""
        return devcluster.wait_until(what, check, timeout, interval)

    def ensure_namespace(self, name: str) -> None:
        """Create the namespace if missing and wait for its default service account."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        core = client.CoreV1Api(self.api_client())
        try:
            core.create_namespace({"metadata": {"name": name}})
        except ApiException as exc:
            if exc.status != 409:
                raise

        def has_sa() -> bool:
            try:
                core.read_namespaced_service_account("default", name)
                return True
            except ApiException:
                return False

        self.wait_for(f"service account {name}/default", has_sa, timeout=30)

    def heartbeats(self, interval_s: float = 10.0) -> devnodes.HeartbeatRefresher:
        """``with cluster.heartbeats(): ...`` keeps the nodes' inventory heartbeats fresh."""
        return devnodes.HeartbeatRefresher(self.api_client(), self.node_names, interval_s)


# --- sharing one dev cluster between concurrent pytest sessions ---------------------------
# Several sessions (engineers, CI jobs) may use the same state folder at once. Each holds a
# lease (a file named by its pid) while it runs; the cluster is stopped by the last session
# to leave, and only if a pytest session started it (marker file), never one started by hand.

LEASES = "e2e-leases"
OWNED = "e2e-owned"  # contents: the started_at of the cluster a session started


@contextlib.contextmanager
def _lease_lock(state_dir: Path) -> Iterator[None]:
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "e2e-leases.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _acquire(state_dir: Path, timeout_s: float = 300) -> tuple[devcluster.ClusterInfo, bool]:
    """Reuse the running cluster or start one; returns (info, started_here)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with _lease_lock(state_dir):
            st = devcluster.status(state_dir)
            if st.up:
                info = devcluster.ClusterInfo.load(state_dir)
                started_here = False
            elif not st.running:
                info = devcluster.up(devcluster.Config(state_dir=state_dir))
                (state_dir / OWNED).write_text(str(info.started_at))
                started_here = True
            else:
                info = None  # starting or half-dead: look again shortly
            if info is not None:
                leases = state_dir / LEASES
                leases.mkdir(exist_ok=True)
                (leases / str(os.getpid())).write_text(info.server)
                return info, started_here
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"dev cluster in {state_dir} neither up nor stopped after {timeout_s}s:\n"
                f"{devcluster.status(state_dir).describe()}\n(run `python -m devcluster down`)"
            )
        time.sleep(2)


def _release(state_dir: Path, info: devcluster.ClusterInfo) -> None:
    with _lease_lock(state_dir):
        leases = state_dir / LEASES
        (leases / str(os.getpid())).unlink(missing_ok=True)
        others = [p for p in leases.glob("*") if p.name.isdigit() and _pid_alive(int(p.name))]
        owned = state_dir / OWNED
        if others or not owned.exists():
            return
        if owned.read_text() == str(info.started_at):
            devcluster.down(state_dir)
        owned.unlink(missing_ok=True)


# Session fixtures a serial run stops early, after the last test that uses them: fixture name
# -> the function that stops what it started (run by whoever pops it: the early stop, else the
# fixture's own end).
_EARLY_STOPS: dict[str, Callable[[], None]] = {}
_LAST_USER: dict[str, str] = {}  # fixture name -> nodeid of its last test in a serial run
# Session fixtures whose users run one after another (one lane): stopped once the next test
# does not use them, in a serial run and on an xdist worker alike
STOPPED_AFTER_THEIR_RUN = ("second_node",)


def pytest_collection_finish(session: pytest.Session) -> None:
    """In a serial run (no xdist workers: a worker does not know which tests it gets next),
    note the last test that uses ``cluster``: the kwok lane's shared control plane is stopped
    after it instead of idling beside the real-node lanes until the session ends."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    last_path = None
    for item in session.items:
        if "cluster" in getattr(item, "fixturenames", ()):
            last_path = item.path
    # the last test of that test's module: the module's own fixtures that use the cluster end
    # with it, before the cluster stops
    for item in session.items:
        if item.path == last_path:
            _LAST_USER["cluster"] = item.nodeid


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if nextitem is None:  # the session's end: the fixtures stop themselves
        return
    done = [name for name, last in _LAST_USER.items() if item.nodeid == last]
    done += [name for name in STOPPED_AFTER_THEIR_RUN
             if name in getattr(item, "fixturenames", ())
             and name not in getattr(nextitem, "fixturenames", ())]
    for name in done:
        stop = _EARLY_STOPS.pop(name, None)
        if stop is not None:
            stop()


@pytest.fixture(scope="session")
def cluster() -> Iterator[E2ECluster]:
    state_dir = devcluster.default_state_dir().expanduser().resolve()
    if devbuild.missing() and os.environ.get("EGPU_E2E_BUILD") == "0":
        pytest.fail(
            f"dev cluster binaries not built ({', '.join(devbuild.missing())}); "
            "run `python -m devcluster.build`"
        )
    info, started_here = _acquire(state_dir)
    try:
        # Waits until every node is Ready and without the not-ready taint that a new Node
        # carries until kwok reports it Ready (DevClusterError naming the nodes otherwise).
        client = info.api_client()
        try:
            names = devnodes.create_nodes(client, CLUSTER_FILE, ready_timeout_s=NODES_READY_S)
        finally:
            client.close()
        handle = E2ECluster(info=info, node_names=names, inputs=INPUTS, started_here=started_here)
    except BaseException:
        _release(state_dir, info)
        raise

    def stop() -> None:
        for client in handle._clients:
            client.close()
        _release(state_dir, info)

    _EARLY_STOPS["cluster"] = stop
    try:
        yield handle
    finally:
        # not stopped early: stop now (whoever pops it stops it, once)
        if _EARLY_STOPS.pop("cluster", None) is not None:
            stop()


# --- lanes (tests/lanes.py; tests/unit/test_lanes.py checks every module has one): each
# real-node lane has its own control plane and real node
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0".. under xdist, "" without


# --- a cluster with a real node (kubelet + containerd) ------------------------------------
# Its own control plane (state folder dev-cluster-real beside the shared one): egpu is
# installed in it for real (kubectl apply -k / helm), which must not meet the webhook and
# egpu-kube-scheduler processes that the other e2e tests start, and its kube-scheduler serves only
# default-scheduler (the installed egpu-scheduler Deployment serves egpu-scheduler).

REAL_NODE = "egpu-real-0"
# The real node's fake cards: four, as a GPU server has several (the density cases fill them)
REAL_CARDS = tuple((f"GPU-7e1e0000-0000-4000-8000-00000000000{i}", "NVIDIA H100 80GB HBM3",
                    81559, 0) for i in range(4))


@dataclass
class RealCluster(E2ECluster):
    """An E2ECluster with one real node (``node``: devcluster.realnode.RealNode)."""

    node: Any = None


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[RealCluster]:
    from devcluster import realnode

    if os.geteuid() != 0:
        pytest.fail("a real node needs root (namespaces, cgroups, mounts): run as root, README")
    state_dir = devcluster.default_state_dir().expanduser().resolve().with_name(
        "dev-cluster-real" + (f"-{WORKER}" if WORKER else ""))
    realnode.remove_all(state_dir)  # what an interrupted earlier run left
    devcluster.down(state_dir)
    info = devcluster.up(devcluster.Config(state_dir=state_dir, egpu_profile=False))
    handle = None
    try:
        node = realnode.add(info, name=REAL_NODE, cards=REAL_CARDS)
        handle = RealCluster(info=info, node_names=[REAL_NODE], inputs=INPUTS,
                             started_here=True, node=node)
        yield handle
    finally:
        if handle is not None:
            for client in handle._clients:
                client.close()
        realnode.remove_all(state_dir)
        devcluster.down(state_dir)


@pytest.fixture(scope="session")
def installed(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[RealCluster]:
    """egpu installed on the real-node cluster by ``kubectl apply -k`` (manifests/ with the
    egpu image overridden to the local tag), every part Ready; namespace ml-serving exists.
    Removed at the end (a test that installs another way removes it first)."""
    from testbed import realnode_install as inst

    work = tmp_path_factory.mktemp("install")
    ca = inst.create_webhook_tls(real_cluster, work)
    kustomize = inst.kustomization(work / "kustomize")
    real_cluster.kubectl("apply", "-k", str(kustomize), timeout=120)
    inst.inject_ca(real_cluster, ca)
    inst.wait_installed(real_cluster)
    real_cluster.ensure_namespace(inst.SHARE_NS)
    yield real_cluster
    real_cluster.kubectl("delete", "namespace", inst.SHARE_NS, "--wait=true", "--timeout=90s",
                         check=False, timeout=120)
    real_cluster.kubectl("delete", "-k", str(kustomize), "--ignore-not-found",
                         "--wait=true", "--timeout=120s", check=False, timeout=150)


@pytest.fixture(scope="session")
def helm_uninstall(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Any]:
    """The ``helm uninstall`` that test_real_node_helm_uninstall.py begins and
    test_real_node_helm_uninstalled.py checks (tests/e2e/helm.py, ``UninstallUnderWay``)."""
    from tests.e2e.helm import UninstallUnderWay

    under_way = UninstallUnderWay(real_cluster, tmp_path_factory.mktemp("helm-uninstall"))
    yield under_way
    under_way.end()


@pytest.fixture(scope="session")
def second_node(installed: RealCluster) -> Iterator[Any]:
    """The density modules' second real node (tests/e2e/density.py), started once for both
    (they run in one lane, one after the other) and stopped once the next test does not use
    it (``STOPPED_AFTER_THEIR_RUN``), else at the session's end."""
    from tests.e2e.density import second_node_running

    stack = contextlib.ExitStack()
    node = stack.enter_context(second_node_running(installed))
    _EARLY_STOPS["second_node"] = stack.close
    try:
        yield node
    finally:
        if _EARLY_STOPS.pop("second_node", None) is not None:
            stack.close()
