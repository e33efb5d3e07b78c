"""CUDA graphs and stream capture under the compute gate (issue 8).

Inference servers (vLLM, TensorRT-LLM, torch.compile "reduce-overhead") capture their
decode steps into CUDA graphs and replay them. Two things must hold for a gated share:

- the gate never breaks a capture: its background event queries are "potentially unsafe"
  calls during a GLOBAL-mode capture and would invalidate it
  (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED at cuStreamEndCapture, seen before the fix);
- a graph launch is capped like the kernels it holds (measured as one piece of work).

The fake GPU follows the driver's capture rules (fakegpu/src/fake_cuda.c,
capture_unsafe_call); the first tests check those rules against the fake alone.
"""

from __future__ import annotations

import ctypes
import threading

import pytest

from .conftest import FAKE, Node, result

CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900
CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901
CUDA_ERROR_CAPTURED_EVENT = 907
CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908
GLOBAL, THREAD_LOCAL, RELAXED = 0, 1, 2


class Fake:
    """The fake libcuda.so.1 through ctypes, one context on card 0."""

    def __init__(self, node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
        env = node.env("ctypes", [0], preload=False, kernel_us=100)
        for k in ("FAKEGPU_CONFIG", "FAKEGPU_STATE_DIR", "FAKEGPU_KERNEL_US"):
            monkeypatch.setenv(k, env[k])
        # a private copy: the fake reads its environment once per process at cuInit
        self.cu = ctypes.CDLL(str(FAKE / "libcuda.so.1"), mode=ctypes.RTLD_LOCAL)
        self.ok(self.cu.cuInit(0))
        dev, self.ctx = ctypes.c_int(), ctypes.c_void_p()
        self.ok(self.cu.cuDeviceGet(ctypes.byref(dev), 0))
        self.ok(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev))
        self.ok(self.cu.cuCtxSetCurrent(self.ctx))

    @staticmethod
    def ok(rc: int) -> None:
        assert rc == 0, f"CUresult {rc}"

    def stream(self) -> ctypes.c_void_p:
        s = ctypes.c_void_p()
        self.ok(self.cu.cuStreamCreate(ctypes.byref(s), 0))
        return s

    def event(self) -> ctypes.c_void_p:
        e = ctypes.c_void_p()
        self.ok(self.cu.cuEventCreate(ctypes.byref(e), 0))
        return e

    def launch(self, s: ctypes.c_void_p) -> int:
        return self.cu.cuLaunchKernel(ctypes.c_void_p(0x1000), 1, 1, 1, 32, 1, 1, 0, s, None, None)

    def begin(self, s: ctypes.c_void_p, mode: int = GLOBAL) -> None:
        self.ok(self.cu.cuStreamBeginCapture_v2(s, mode))

    def end(self, s: ctypes.c_void_p) -> tuple[int, ctypes.c_void_p]:
        g = ctypes.c_void_p()
        return self.cu.cuStreamEndCapture(s, ctypes.byref(g)), g

    def in_thread(self, fn, mode: int | None = None) -> int:
        """fn() on another thread (with this context current, in `mode`); its result."""
        out: list[int] = []

        def body() -> None:
            self.ok(self.cu.cuCtxSetCurrent(self.ctx))
            if mode is not None:
                m = ctypes.c_int(mode)
                self.ok(self.cu.cuThreadExchangeStreamCaptureMode(ctypes.byref(m)))
            out.append(fn())

        t = threading.Thread(target=body)
        t.start()
        t.join()
        return out[0]


@pytest.fixture
def fake(node: Node, monkeypatch: pytest.MonkeyPatch) -> Fake:
    return Fake(node, monkeypatch)


def test_fake_event_query_from_another_thread_invalidates_a_global_capture(fake: Fake) -> None:
    s, other = fake.stream(), fake.stream()
    ev = fake.event()
    fake.ok(fake.cu.cuEventRecord(ev, other))
    fake.begin(s, GLOBAL)
    fake.ok(fake.launch(s))
    assert fake.in_thread(lambda: fake.cu.cuEventQuery(ev)) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    rc, g = fake.end(s)
    assert rc == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and not g.value


@pytest.mark.parametrize("mode", [RELAXED, THREAD_LOCAL], ids=["relaxed", "thread-local"])
def test_fake_other_threads_may_query_unless_in_global_mode(fake: Fake, mode: int) -> None:
    s, other = fake.stream(), fake.stream()
    ev = fake.event()
    fake.ok(fake.cu.cuEventRecord(ev, other))
    fake.begin(s, GLOBAL)
    fake.ok(fake.launch(s))
    assert fake.in_thread(lambda: fake.cu.cuEventQuery(ev), mode) == 0
    rc, g = fake.end(s)
    assert rc == 0 and g.value


def test_fake_capture_records_work_instead_of_running_it(fake: Fake) -> None:
    s = fake.stream()
    ev = fake.event()
    fake.begin(s, THREAD_LOCAL)
    for _ in range(5):
        fake.ok(fake.launch(s))
    st = ctypes.c_int(-1)
    fake.ok(fake.cu.cuStreamIsCapturing(s, ctypes.byref(st)))
    assert st.value == 1  # CU_STREAM_CAPTURE_STATUS_ACTIVE
    fake.ok(fake.cu.cuEventRecord(ev, s))
    # a captured event and the capturing stream cannot be waited on
    assert fake.cu.cuEventQuery(ev) == CUDA_ERROR_CAPTURED_EVENT
    assert fake.cu.cuStreamSynchronize(s) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    rc, _ = fake.end(s)
    assert rc == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED  # the synchronise broke it
    fake.begin(s, THREAD_LOCAL)
    for _ in range(5):
        fake.ok(fake.launch(s))
    rc, g = fake.end(s)
    fake.ok(rc)
    ex = ctypes.c_void_p()
    fake.ok(fake.cu.cuGraphInstantiateWithFlags(ctypes.byref(ex), g, ctypes.c_ulonglong(0)))
    fake.ok(fake.cu.cuGraphLaunch(ex, s))
    fake.ok(fake.cu.cuEventRecord(ev, s))
    fake.ok(fake.cu.cuStreamSynchronize(s))
    fake.ok(fake.cu.cuEventQuery(ev))
    st.value = -1
    fake.ok(fake.cu.cuStreamIsCapturing(s, ctypes.byref(st)))
    assert st.value == 0


def test_fake_a_global_capture_must_end_on_its_thread(fake: Fake) -> None:
    s = fake.stream()
    fake.begin(s, GLOBAL)
    rc = fake.in_thread(lambda: fake.end(s)[0], RELAXED)
    assert rc == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
    fake.ok(fake.end(s)[0])


@pytest.mark.parametrize(
    "share",
    [
        {"cores": 30},
        {"priority": "low"},
        {"cores": 0, "beside_low": True},
    ],
    ids=["capped-30", "low-priority", "high-watched-beside-low"],
)
def test_the_gate_never_invalidates_a_capture(node: Node, share: dict) -> None:
    """compute_load -g: measurements pending, then a GLOBAL capture held for 50 ms while
    the gate's poller runs; cuStreamEndCapture must succeed (before the fix: 901)."""
    share = dict(share)
    procs = []
    if share.pop("beside_low", False):
        procs.append(node.load(node.env("lo", [0], priority="low", kernel_us=500), 2, "-s", 4))
    p = node.load(node.env("g", [0], kernel_us=500, **share), 1.0, "-g", 10, "-s", 1, delay=0.3)
    r = result(p)[0]
    assert r["capture_rc"] == 0, r
    assert r["launches"] > 0, r
    for q in procs:
        result(q)


def test_graph_launches_are_capped(node: Node) -> None:
    """A 30% share replaying a graph of ten 500 us kernels gets 30% of the card."""
    p = node.load(node.env("g", [0], cores=30, kernel_us=500), 3, "-g", 10, "-s", 1)
    r = result(p)[0]
    assert r["capture_rc"] == 0, r
    steady = r["win_use_pct"][1:]
    assert max(steady) <= 33 and sum(steady) / len(steady) >= 27, r
