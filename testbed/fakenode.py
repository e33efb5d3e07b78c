"""A fake node for the real-time compute benchmarks: fake cards (fakegpu.ini), an egpu runtime
folder, and share processes of libinterpose/build/compute_load under the interposer, each with
its own container config."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from egpu.records import ConfigCard, ContainerConfig

REPO = Path(__file__).resolve().parents[1]
LIB = REPO / "libinterpose" / "build"
FAKE = REPO / "fakegpu" / "build"


def card_uuid(i: int) -> str:
    return f"GPU-cafe0000-0000-4000-8000-{i:012x}"


def build() -> None:
    """Builds the fake GPU and the interposer (make), quietly."""
    for d in ("fakegpu", "libinterpose"):
        subprocess.run(["make", "-s", "-C", str(REPO / d)], check=True, capture_output=True)


class FakeNode:
    """``cards`` fake cards of 24 GiB under ``tmp`` and an egpu runtime folder there."""

    def __init__(self, tmp: Path, cards: int) -> None:
        self.tmp = tmp
        (tmp / "fake.ini").write_text(
            "".join(f"[card]\nuuid = {card_uuid(i)}\nmemory_mib = 24576\n\n" for i in range(cards))
        )
        self.n = 0

    def env(self, card: int, cores: int, kernel_us: float, priority: str = "high"
            ) -> dict[str, str]:
        """The environment of a fresh strict share of ``cores`` % (0: uncapped) on ``card``,
        its kernels ``kernel_us`` long."""
        self.n += 1
        rt = self.tmp / "rt"
        cfg = ContainerConfig(
            namespace="bench",
            pod=f"p{self.n}",
            pod_uid=f"u{self.n}",
            container="c",
            priority=priority,
            compute_policy="strict",
            memory_oversubscription=False,
            container_region=str(rt / "containers" / f"u{self.n}" / "region"),
            cards=(ConfigCard(card_uuid(card), 4096, cores, str(rt / "cards" / card_uuid(card))),),
        )
        path = self.tmp / f"cfg{self.n}.json"
        path.write_text(cfg.encode())
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LD_LIBRARY_PATH": str(FAKE),
            "LD_PRELOAD": str(LIB / "libegpu_interpose.so"),
            "FAKEGPU_CONFIG": str(self.tmp / "fake.ini"),
            "FAKEGPU_STATE_DIR": str(self.tmp / "fake"),
            "FAKEGPU_KERNEL_US": str(kernel_us),
            "EGPU_RUNTIME_DIR": str(rt),
            "EGPU_CONFIG_PATH": str(path),
            "CUDA_VISIBLE_DEVICES": card_uuid(card),
        }

    @staticmethod
    def load(env: dict[str, str], seconds: float, *args: object) -> subprocess.Popen[str]:
        """compute_load -t seconds ARGS under ``env``, started now."""
        return subprocess.Popen(
            [str(LIB / "compute_load"), "-t", str(seconds), *map(str, args)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    @staticmethod
    def result(p: subprocess.Popen[str], timeout_s: float = 120) -> dict:
        """The first JSON line compute_load printed; SystemExit with its error otherwise."""
        stdout, stderr = p.communicate(timeout=timeout_s)
        if p.returncode:
            raise SystemExit(f"compute_load rc={p.returncode}: {stderr}")
        return json.loads(stdout.splitlines()[0])
