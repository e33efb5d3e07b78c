"""A test driver of the device plugin API v1beta1: the calls the kubelet makes, made on
purpose in the orders the unit tests need (tests/node/test_device_plugin.py). Test code only:
egpu's device plugin runs against the real kubelet in tests/e2e/test_real_node*.py.

``KubeletStub`` serves Registration on ``<dir>/kubelet.sock``. When a plugin registers, it
dials the plugin's endpoint, follows ListAndWatch in a thread (``devices`` is the latest list)
and lets the caller make the calls the kubelet makes at pod admission:
GetPreferredAllocation and Allocate. ``restart()`` does what a kubelet restart does to the
folder: it removes every socket and serves a new kubelet.sock.
"""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import Sequence
from concurrent import futures

import grpc

from node_agent.deviceplugin import api_pb2, api_pb2_grpc
from node_agent.deviceplugin.service import KUBELET_SOCKET


class KubeletStub(api_pb2_grpc.RegistrationServicer):
    """A Registration server and a DevicePlugin client (module docstring)."""

    def __init__(self, plugin_dir: str) -> None:
        self.plugin_dir = plugin_dir
        self.requests: list[api_pb2.RegisterRequest] = []
        self.devices: list[api_pb2.Device] = []
        self.lists = 0
        self.changed = threading.Condition()
        self._server: grpc.Server | None = None
        self._channel: grpc.Channel | None = None
        self._stub: api_pb2_grpc.DevicePluginStub | None = None

    # --- Registration ---------------------------------------------------------------------
    def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> api_pb2.Empty:
        self.requests.append(request)
        channel = grpc.insecure_channel(f"unix://{os.path.join(self.plugin_dir, request.endpoint)}")
        self._channel, self._stub = channel, api_pb2_grpc.DevicePluginStub(channel)
        threading.Thread(target=self._watch, args=(self._stub,), daemon=True).start()
        return api_pb2.Empty()

    def _watch(self, stub: api_pb2_grpc.DevicePluginStub) -> None:
        try:
            for response in stub.ListAndWatch(api_pb2.Empty()):
                with self.changed:
                    self.devices = list(response.devices)
                    self.lists += 1
                    self.changed.notify_all()
        except grpc.RpcError:
            return

    def wait_for_list(self, count: int, timeout: float = 10.0) -> list[api_pb2.Device]:
        """Wait until ``count`` lists have arrived in total; returns the latest."""
        with self.changed:
            if not self.changed.wait_for(lambda: self.lists >= count, timeout):
                raise TimeoutError(f"ListAndWatch sent {self.lists} lists, expected {count}")
            return list(self.devices)

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Serve Registration on ``<plugin_dir>/kubelet.sock``."""
        os.makedirs(self.plugin_dir, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{os.path.join(self.plugin_dir, KUBELET_SOCKET)}")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._server is not None:
            self._server.stop(grace=0).wait()
            self._server = None

    def restart(self) -> None:
        """As a kubelet restart: stop, remove every socket of the folder, serve again."""
        self.stop()
        for path in glob.glob(os.path.join(self.plugin_dir, "*.sock")):
            os.unlink(path)
        self.start()

    # --- the kubelet's calls at admission ---------------------------------------------------
    def _plugin(self) -> api_pb2_grpc.DevicePluginStub:
        if self._stub is None:
            raise RuntimeError("no plugin registered")
        return self._stub

    def preferred(self, available: Sequence[str], size: int,
                  must_include: Sequence[str] = ()) -> list[str]:
        """GetPreferredAllocation for one container."""
        response = self._plugin().GetPreferredAllocation(api_pb2.PreferredAllocationRequest(
            container_requests=[api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=list(available), must_include_deviceIDs=list(must_include),
                allocation_size=size)]), timeout=10)
        return list(response.container_responses[0].deviceIDs)

    def allocate_response(self, device_ids: Sequence[str]) -> api_pb2.ContainerAllocateResponse:
        """Allocate for one container; returns its whole answer (envs, CDI devices)."""
        response = self._plugin().Allocate(api_pb2.AllocateRequest(container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=list(device_ids))]), timeout=10)
        return response.container_responses[0]

    def allocate_refusal(self, device_ids: Sequence[str]) -> str:
        """Allocate for one container that the plugin must refuse: the RPC's error details
        (the kubelet fails the pod's admission with them: UnexpectedAdmissionError)."""
        try:
            self.allocate_response(device_ids)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc
            return str(exc.details())
        raise AssertionError(f"Allocate {list(device_ids)} was not refused")

    def allocate(self, device_ids: Sequence[str]) -> dict[str, str]:
        """Allocate for one container; returns its environment."""
        return dict(self.allocate_response(device_ids).envs)
