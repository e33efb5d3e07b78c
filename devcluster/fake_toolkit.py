"""The fake GPU's container toolkit: what nvidia-container-runtime does on a real GPU node, for
the fake driver (``fakegpu/``) on a real node of the dev cluster.

On a GPU node the NVIDIA Container Toolkit is containerd's default runtime: a wrapper around
runc that, for a container whose environment names cards in ``NVIDIA_VISIBLE_DEVICES``, adds
the driver's user-space libraries (libcuda.so.1, libnvidia-ml.so.1) and those cards to the
container, then runs runc. These machines have no GPU, so the real toolkit cannot run; this
wrapper does the same with the fake driver: it mounts the fake libraries read-only where the
real ones live, gives the container a card list with only its visible cards (the real driver
inside a container sees only the device nodes it was given) and the card-wide state folder,
and then execs runc with the same arguments. ``NVIDIA_VISIBLE_DEVICES`` unset, empty,
``void`` or ``none``: the container is left as it is.

Usage (containerd's runtime ``BinaryName`` points at a shell wrapper that calls this only for
``create``): ``python3 fake_toolkit.py --driver-root DIR --runc PATH -- RUNC_ARGS...``.
``DIR`` holds ``lib/libcuda.so.1``, ``lib/libnvidia-ml.so.1``, ``cards.ini`` and ``state/``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

# The fake GPU's device nodes, as the NVIDIA driver makes them: one character device per card
# (/dev/nvidia<i>, major 195, minor i) and the control nodes. A real driver gives nvidia-uvm a
# dynamic major; the fake keeps every node on 195 (minors 250, 251 for the uvm pair).
NVIDIA_MAJOR = 195
CONTROL_NODES = (("nvidiactl", 255), ("nvidia-uvm", 250), ("nvidia-uvm-tools", 251))
LIB_DIR_IN_CONTAINER = "/usr/lib/x86_64-linux-gnu"  # Debian's multiarch folder, on ld's path
CARDS_IN_CONTAINER = "/etc/fakegpu/cards.ini"
STATE_IN_CONTAINER = "/var/run/fakegpu"
DRIVER_LIBS = ("libcuda.so.1", "libnvidia-ml.so.1")
NO_CARDS = ("", "void", "none")


def device_nodes(ncards: int) -> list[tuple[str, int, int]]:
    """The fake GPU's device nodes for ``ncards`` cards: (name under /dev, major, minor)."""
    return [(name, NVIDIA_MAJOR, minor) for name, minor in CONTROL_NODES] + [
        (f"nvidia{i}", NVIDIA_MAJOR, i) for i in range(ncards)]


def make_device_nodes(folder: Path, ncards: int) -> None:
    """The fake GPU's device nodes in ``folder`` (a node agent's ``--dev-root``): character
    devices where this process may make them (root), else links to /dev/null (a character
    device too) for an agent that only looks at them. Existing entries are replaced."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, major, minor in device_nodes(ncards):
        path = folder / name
        if path.is_symlink() or path.exists():
            path.unlink()
        try:
            os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))  # S_IFCHR
        except PermissionError:
            path.symlink_to("/dev/null")


def device_node_commands(dev: str, ncards: int) -> list[str]:
    """Shell commands that make the fake GPU's device nodes in folder ``dev`` (a real node's
    own /dev, as root)."""
    return [f"mknod -m 666 {dev}/{name} c {major} {minor}"
            for name, major, minor in device_nodes(ncards)]


def parse_cards(text: str) -> list[list[str]]:
    """The ``[card]`` sections of a fake GPU ini, each as its lines (comments dropped)."""
    sections: list[list[str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            sections.append([line])
        elif sections:
            sections[-1].append(line)
    return sections


def _uuid(section: list[str]) -> str:
    for line in section[1:]:
        key, _, value = line.partition("=")
        if key.strip() == "uuid":
            return value.strip().strip("\"'")
    return ""


def visible_cards_ini(text: str, visible: str) -> str:
    """The ini a container sees: the cards ``visible`` names (``all``, indexes or UUIDs,
    comma-separated), in that order; unknown entries are dropped (the toolkit refuses
    them at create on a real node; here the interposer's own check then fails closed)."""
    sections = parse_cards(text)
    if visible.strip() == "all":
        chosen = sections
    else:
        chosen = []
        for entry in (e.strip() for e in visible.split(",")):
            for i, section in enumerate(sections):
                if entry == str(i) or (entry and entry == _uuid(section)):
                    chosen.append(section)
    return "".join("\n".join(s) + "\n" for s in chosen)


def edit_spec(spec: dict[str, Any], driver_root: Path, bundle: Path) -> bool:
    """Add the fake driver to an OCI runtime spec (``config.json``) when its process asks for
    cards. Returns True when the spec changed."""
    env: list[str] = spec.get("process", {}).get("env", [])
    values = dict(e.split("=", 1) for e in env if "=" in e)
    visible = values.get("NVIDIA_VISIBLE_DEVICES", "")
    if visible.strip() in NO_CARDS:
        return False
    ini = bundle / "fakegpu-cards.ini"
    ini.write_text(visible_cards_ini((driver_root / "cards.ini").read_text(), visible))
    mounts: list[dict[str, Any]] = spec.setdefault("mounts", [])
    for lib in DRIVER_LIBS:
        mounts.append({"destination": f"{LIB_DIR_IN_CONTAINER}/{lib}", "type": "bind",
                       "source": str(driver_root / "lib" / lib),
                       "options": ["rbind", "ro", "nosuid", "nodev"]})
    mounts.append({"destination": CARDS_IN_CONTAINER, "type": "bind", "source": str(ini),
                   "options": ["rbind", "ro", "nosuid", "nodev"]})
    mounts.append({"destination": STATE_IN_CONTAINER, "type": "bind",
                   "source": str(driver_root / "state"),
                   "options": ["rbind", "rw", "nosuid", "nodev"]})
    env += [f"FAKEGPU_CONFIG={CARDS_IN_CONTAINER}", f"FAKEGPU_STATE_DIR={STATE_IN_CONTAINER}"]
    spec["process"]["env"] = env
    return True


def bundle_of(args: list[str]) -> Path:
    """The ``--bundle``/``-b`` folder of a ``runc create`` command line (default: cwd)."""
    for i, arg in enumerate(args):
        if arg in ("--bundle", "-b") and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith(("--bundle=", "-b=")):
            return Path(arg.split("=", 1)[1])
    return Path.cwd()


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: fake_toolkit.py --driver-root DIR --runc PATH -- RUNC_ARGS...",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    opts, runc_args = argv[:split], argv[split + 1:]
    driver_root = Path(opts[opts.index("--driver-root") + 1])
    runc = opts[opts.index("--runc") + 1]
    if "create" in runc_args:
        bundle = bundle_of(runc_args)
        config = bundle / "config.json"
        spec = json.loads(config.read_text())
        if edit_spec(spec, driver_root, bundle):
            config.write_text(json.dumps(spec))
    os.execv(runc, [runc, *runc_args])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
