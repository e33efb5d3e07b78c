"""The kubelet plugin's gRPC edge: plugin registration (pluginregistration/v1) and the DRA
service (dra/v1 and dra/v1beta1), as the kubelet v1.37 speaks them.

Facts of kubelet v1.37.2 (pkg/kubelet/pluginmanager, pkg/kubelet/cm/dra/plugin):

- the plugin watcher watches ``<kubelet root>/plugins_registry/`` (``/var/lib/kubelet``) for
  sockets; for each it calls ``Registration.GetInfo`` and expects ``type`` ``DRAPlugin``,
  ``name`` the driver (``gpu.egpu.io``), ``endpoint`` the DRA service's socket (an absolute
  path, dialled as ``unix:<endpoint>``) and ``supported_versions`` the gRPC services the
  plugin serves, of which the kubelet takes the first it knows (``v1.DRAPlugin``,
  ``v1beta1.DRAPlugin``); then ``NotifyRegistrationStatus`` says whether it registered.
  It registers again on its own when it restarts (it scans the folder); a socket removed
  unregisters the plugin, a new one registers it (the agent's restart).
- NodePrepareResources / NodeUnprepareResources take a batch of claims (namespace, uid,
  name) of one pod and expect an answer per claim UID: its devices (request names, pool,
  device, CDI device IDs, share ID (v1 only)) or an error, which fails the pod's start (the
  kubelet retries and shows it in the pod's events).

``KubeletPlugin`` serves the DRA service on ``<kubelet>/plugins/gpu.egpu.io/dra.sock`` and the
registration on ``<kubelet>/plugins_registry/gpu.egpu.io-reg.sock``, and serves them anew
when a socket vanished (checked every second). It waits for the kubelet's
``plugins_registry`` folder to exist and never creates it (no kubelet, no plugin).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from concurrent import futures
from typing import Any, Protocol

import grpc

from egpu.contract import DRA_DRIVER
from egpu.dra.allocation import ClaimError
from egpu.dra.shareconfig import ShareConfigError
from node_agent.draplugin.driver import PreparedDevice
from node_agent.draplugin.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    registration_v1_pb2,
    registration_v1_pb2_grpc,
)

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"  # pluginregistration/v1 constants.go DRAPlugin
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # dra/v1, dra/v1beta1 types.go
DEFAULT_KUBELET_DIR = "/var/lib/kubelet"
REGISTRY_SUBDIR = "plugins_registry"  # kubelet's DefaultKubeletPluginsRegistrationDirName
PLUGINS_SUBDIR = "plugins"
DRA_SOCKET = "dra.sock"
REGISTRATION_SOCKET = f"{DRA_DRIVER}-reg.sock"


class Driver(Protocol):
    """What the DRA service calls (node_agent.draplugin.driver.DraDriver)."""

    def prepare(self, namespace: str, uid: str, name: str) -> list[PreparedDevice]: ...

    def unprepare(self, uid: str) -> None: ...


class DraService:
    """The DRAPlugin service for one API version (``pb``: dra_v1_pb2 or dra_v1beta1_pb2)."""

    def __init__(self, driver: Driver, pb: Any) -> None:
        self.driver = driver
        self.pb = pb
        self._share_id = "share_id" in pb.Device.DESCRIPTOR.fields_by_name

    def _device(self, d: PreparedDevice) -> Any:
        # The request's own name: a result of a firstAvailable alternative names its
        # subrequest ("jupyter/mib-81559"), and the kubelet (v1.37.2 claiminfo.go
        # cdiDevicesAsList) gives a container, which names "jupyter", only the devices whose
        # request_names contain that name; the Go helper strips them too
        # (kubeletplugin.stripSubrequestNames). Unstripped, the container gets no CDI device.
        device = self.pb.Device(request_names=[d.request.split("/", 1)[0]], pool_name=d.pool,
                                device_name=d.device, cdi_device_ids=list(d.cdi_device_ids))
        if self._share_id and d.share_id:
            device.share_id = d.share_id
        return device

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        answer = self.pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            entry = answer.claims[claim.uid]
            try:
                devices = self.driver.prepare(claim.namespace, claim.uid, claim.name)
                entry.devices.extend(self._device(d) for d in devices)
            except (ClaimError, ShareConfigError) as exc:
                log.warning("NodePrepareResources %s/%s: %s", claim.namespace, claim.name, exc)
                entry.error = f"egpu: {exc}"
            except Exception as exc:  # the API server or the disk; the kubelet retries
                log.warning("NodePrepareResources %s/%s: %s", claim.namespace, claim.name, exc)
                entry.error = f"egpu: cannot prepare ResourceClaim {claim.namespace}/" \
                              f"{claim.name}: {type(exc).__name__}: {exc}"
        return answer

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        answer = self.pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            entry = answer.claims[claim.uid]
            try:
                self.driver.unprepare(claim.uid)
            except Exception as exc:  # the kubelet retries
                log.warning("NodeUnprepareResources %s/%s: %s", claim.namespace, claim.name, exc)
                entry.error = f"egpu: cannot unprepare ResourceClaim {claim.namespace}/" \
                              f"{claim.name}: {exc}"
        return answer


class DraServiceV1(DraService, dra_v1_pb2_grpc.DRAPluginServicer):
    """dra/v1 DRAPlugin."""

    def __init__(self, driver: Driver) -> None:
        DraService.__init__(self, driver, dra_v1_pb2)


class DraServiceV1beta1(DraService, dra_v1beta1_pb2_grpc.DRAPluginServicer):
    """dra/v1beta1 DRAPlugin."""

    def __init__(self, driver: Driver) -> None:
        DraService.__init__(self, driver, dra_v1beta1_pb2)


class Registration(registration_v1_pb2_grpc.RegistrationServicer):
    """pluginregistration/v1 Registration: what the kubelet's plugin watcher asks.
    ``registered``: how many times the kubelet said it registered the plugin."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.registered = 0
        self.last_error = ""
        self.changed = threading.Event()

    def GetInfo(self, request: Any, context: Any) -> Any:
        return registration_v1_pb2.PluginInfo(type=PLUGIN_TYPE, name=DRA_DRIVER,
                                              endpoint=self.endpoint,
                                              supported_versions=list(SUPPORTED_VERSIONS))

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        if request.plugin_registered:
            self.registered += 1
            log.info("the kubelet registered the DRA plugin %s (%s)", DRA_DRIVER, self.endpoint)
        else:
            self.last_error = request.error
            log.warning("the kubelet did not register the DRA plugin %s: %s", DRA_DRIVER,
                        request.error)
        self.changed.set()
        return registration_v1_pb2.RegistrationStatusResponse()


class KubeletPlugin:
    """Serves the DRA service and the registration socket (module docstring)."""

    def __init__(self, driver: Driver, kubelet_dir: str = DEFAULT_KUBELET_DIR) -> None:
        self.driver = driver
        self.registry_dir = os.path.join(kubelet_dir, REGISTRY_SUBDIR)
        self.plugin_dir = os.path.join(kubelet_dir, PLUGINS_SUBDIR, DRA_DRIVER)
        self.dra_socket = os.path.join(self.plugin_dir, DRA_SOCKET)
        self.registration_socket = os.path.join(self.registry_dir, REGISTRATION_SOCKET)
        self.registration = Registration(self.dra_socket)
        self._servers: list[grpc.Server] = []
        self._inodes: tuple[int, int] | None = None
        self.starts = 0

    def _inodes_now(self) -> tuple[int, int] | None:
        try:
            return (os.stat(self.dra_socket).st_ino, os.stat(self.registration_socket).st_ino)
        except FileNotFoundError:
            return None

    def start(self) -> None:
        """Serve the DRA service, then the registration socket (old sockets removed
        first: the kubelet sees a new plugin). Raises OSError or RuntimeError."""
        os.makedirs(self.plugin_dir, mode=0o750, exist_ok=True)
        for path in (self.registration_socket, self.dra_socket):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        dra = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DraServiceV1(self.driver), dra)
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(DraServiceV1beta1(self.driver), dra)
        dra.add_insecure_port(f"unix://{self.dra_socket}")
        dra.start()
        self._servers.append(dra)
        registration = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        registration_v1_pb2_grpc.add_RegistrationServicer_to_server(self.registration,
                                                                    registration)
        registration.add_insecure_port(f"unix://{self.registration_socket}")
        registration.start()
        self._servers.append(registration)
        self._inodes = self._inodes_now()
        self.starts += 1
        log.info("DRA plugin %s serving %s, registration socket %s", DRA_DRIVER,
                 self.dra_socket, self.registration_socket)

    def stop(self) -> None:
        """Stop serving and remove the sockets (the kubelet unregisters the plugin)."""
        for server in self._servers:
            server.stop(grace=0.5).wait()
        self._servers = []
        for path in (self.registration_socket, self.dra_socket):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def ensure(self) -> bool:
        """One step of the keep-alive loop: (re)start when the kubelet's registry folder
        exists and a socket of ours is missing or replaced. Returns True when it started."""
        if not os.path.isdir(self.registry_dir):
            return False
        if self._servers and self._inodes is not None and self._inodes == self._inodes_now():
            return False
        self.stop()
        try:
            self.start()
        except (OSError, RuntimeError) as exc:
            log.warning("DRA plugin: cannot serve: %s", exc)
            self.stop()
            return False
        return True

    def run(self, stop: threading.Event, interval: float = 1.0) -> None:
        """Keep serving until ``stop`` is set."""
        while not stop.is_set():
            self.ensure()
            stop.wait(interval)
        self.stop()
