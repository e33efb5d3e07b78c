"""The real-client tier's environments (issue 25): NVIDIA's own driver bindings, pinned, each in
a virtual environment of its own (two major versions of one package cannot share one), built
once from the package registry and cached outside the clone like the other slow builds.

    python -m testbed.clients            # make clients: build every missing environment
    python(name) -> Path                 # the environment's Python (built when missing)

An environment lives in ``~/.cache/egpu/clients/<name>-<key>/`` (``$EGPU_CACHE_DIR`` else
``~/.cache/egpu``), ``key`` a digest of its pins: a changed pin builds a new one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

# name -> the exact packages (pip requirement lines); numpy: cuda.bindings.nvml needs it;
# cuda.core (NVIDIA's high-level API) is built on the 13.x bindings; numba-cuda compiles
# kernels to PTX on the host (NVVM, nvJitLink from NVIDIA's wheels; no GPU needed) and loads
# them through cuda.core: every package of its environment is pinned
CLIENTS: dict[str, tuple[str, ...]] = {
    "cuda-bindings-12": ("cuda-bindings==12.9.10", "numpy==2.4.6"),
    "cuda-bindings-13": ("cuda-bindings==13.5.0", "cuda-core==1.2.2", "numpy==2.4.6"),
    "numba-cuda": ("numba-cuda==0.30.4", "numba==0.68.1", "llvmlite==0.50.0",
                   "cuda-bindings==13.5.0", "cuda-core==1.2.2", "cuda-pathfinder==1.9.1",
                   "cuda-toolkit==13.5.0", "nvidia-cuda-cccl==13.3.5.0.6",
                   "nvidia-cuda-nvrtc==13.5.37", "nvidia-cuda-runtime==13.5.37",
                   "nvidia-nvjitlink==13.5.37", "nvidia-nvvm==13.5.37", "numpy==2.4.6"),
}


def cache_dir() -> Path:
    base = os.environ.get("EGPU_CACHE_DIR") or str(Path.home() / ".cache" / "egpu")
    return Path(base) / "clients"


def env_dir(name: str) -> Path:
    """Where client environment ``name`` lives (keyed by its pins)."""
    key = hashlib.sha256("\n".join(CLIENTS[name]).encode()).hexdigest()[:12]
    return cache_dir() / f"{name}-{key}"


def python(name: str) -> Path:
    """The Python of client environment ``name``, built first when missing (a venv and a
    pip install of its pins; one without its ``.complete`` mark is built again). Raises
    subprocess.CalledProcessError with pip's output when the registry refuses."""
    folder = env_dir(name)
    exe = folder / "bin" / "python"
    if (folder / ".complete").exists():
        return exe
    shutil.rmtree(folder, ignore_errors=True)  # a half-built one
    folder.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    subprocess.run([str(exe), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    *CLIENTS[name]], check=True)
    (folder / ".complete").write_text("\n".join(CLIENTS[name]) + "\n")
    return exe


def main() -> int:
    for name in CLIENTS:
        print(f"==> client environment {name}: {python(name).parent.parent}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
