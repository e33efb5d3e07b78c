"""Raw containers (no Kubernetes: containerd with egpu's CDI device, docs/containerd.md) in real
runc containers: the share from the environment, its cards from ``EGPU_CDI_CARD_<i>``, its
region in the folder the hook mounts, and everything freed at poststop.

The fake GPU's default card (24576 MiB) is the container's egpu.io/gpu=0.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from demo.sandbox import FAKE_DEFAULT_MIB, FAKE_DEFAULT_UUID, HOOK, RuncWorld
from egpu import card_roster
from egpu.contract import container_region_path

pytestmark = pytest.mark.runc

CUDA_ERROR_OUT_OF_MEMORY = 2
PERCENT = 25
CDI_ENV = {"EGPU_CDI_CARD_0": FAKE_DEFAULT_UUID}  # what CDI's egpu.io/gpu=0 sets


def _raw_names(world: RuncWorld) -> list[tuple[str, int]]:
    """(name, cores) of the raw containers' entries in the card's roster."""
    card = world.runtime_dir / "cards" / FAKE_DEFAULT_UUID
    if not (card / card_roster.ROSTER_FILE).exists():
        return []
    return sorted((e.name, e.cores) for e in card_roster.read_roster(str(card)).shares().values()
                  if e.name.startswith("egpu-test-"))


def _poststop(world: RuncWorld, name: str, bundle: Path) -> subprocess.CompletedProcess[str]:
    """egpu-hook at poststop, as the runtime runs it (the state on stdin)."""
    state = json.dumps({"ociVersion": "1.0.2", "id": name, "status": "stopped",
                        "bundle": str(bundle)})
    return subprocess.run([str(HOOK), *world.hook_entry("poststop")["args"][1:]], input=state,
                          capture_output=True, text=True, timeout=30)


def test_a_raw_cdi_container_is_capped_in_the_folder_the_hook_mounts(
        interposer_world: RuncWorld) -> None:
    """Bugs: the CDI card (EGPU_CDI_CARD_0, no NVIDIA_VISIBLE_DEVICES) was never registered
    on the card, and the interposer wrote its region to containers/local-uid<uid>/ in the
    container's own filesystem instead of the <id>_raw folder the hook mounted (the node never
    saw it); and the folders stayed after the container was gone."""
    world = interposer_world
    env = {**CDI_ENV, "EGPU_MEMORY_PERCENTAGE": str(PERCENT), "EGPU_CORES": "30"}
    result, bundle = world.run(["/probe", str(FAKE_DEFAULT_MIB // 2)], env)
    assert result.returncode == 0, result.stderr
    assert result.values["total_mib"] == FAKE_DEFAULT_MIB * PERCENT // 100, result.stdout
    assert result.values["alloc"] == CUDA_ERROR_OUT_OF_MEMORY, result.stdout
    name = bundle.name
    region = Path(container_region_path(f"{name}_raw", str(world.runtime_dir)))
    assert region.is_file() and region.stat().st_size > 0
    assert _raw_names(world) == [(f"{name}_raw", 30)]
    done = _poststop(world, name, bundle)
    assert done.returncode == 0, done.stderr
    assert not region.parent.exists()
    assert not (world.private_dir / "hook" / f"{name}_raw").exists()
    assert _raw_names(world) == []


def test_a_raw_cdi_container_without_a_share_is_refused(runc_world: RuncWorld) -> None:
    """Bug: egpu.io/gpu=<n> through CDI without EGPU_* passed untouched: the whole card, no
    interposer."""
    result, _ = runc_world.run(["/probe", "0"], CDI_ENV)
    assert result.returncode != 0 and not result.stdout
    assert "EGPU_MEMORY_LIMIT_MIB" in result.stderr and "EGPU_MEMORY_PERCENTAGE" in result.stderr


def test_runc_runs_the_poststop_hook_that_frees_a_raw_share(runc_world: RuncWorld) -> None:
    """Bug: containers/<id>_raw and hook/<id>_raw (and the roster entry) were left behind for
    every raw container."""
    env = {**CDI_ENV, "EGPU_MEMORY_LIMIT_MIB": "4096"}
    result, bundle = runc_world.run(["/probe", "0"], env, poststop=True)
    assert result.returncode == 0, result.stderr
    assert not (runc_world.runtime_dir / "containers" / f"{bundle.name}_raw").exists()
    assert not (runc_world.private_dir / "hook" / f"{bundle.name}_raw").exists()
    assert _raw_names(runc_world) == []
