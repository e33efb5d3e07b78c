"""Build the runtime hook as one self-contained file: ``python -m runtime_hook.bundle OUT``.

The runtime runs the hook for every container a node creates, so the installed file is made to
start fast. It is a plain Python script (shebang ``#!/usr/bin/python3 -IS``: isolated mode, no
``site``) holding ``runtime_hook`` and the core modules the hook uses (``egpu.contract``, which
imports nothing, ``egpu.records``, which imports it and the standard library's ``json``, and
``egpu.card_roster``, which imports it, ``egpu.safefile`` and ``struct``, ``fcntl`` and
``time``; and, for the paths that need them, ``egpu.region_layout`` and
``egpu.driver_limits``):
each module's compiled code (``marshal``, for the building interpreter's
bytecode version) and its source (zlib), as base64 text, imported on demand through a small
``sys.meta_path`` finder (the script is parsed at every run: it is kept small). Another
interpreter version compiles the sources instead (slower, same behaviour). It is not a
zipapp: running a zip makes Python import ``runpy``, ``importlib.util`` and ``contextlib``
(about 8 ms) before the first line of the hook.

The node DaemonSet's init container installs it as ``/usr/local/egpu/bin/egpu-hook``; it needs
nothing on the node but python3 (>= 3.11).
"""

from __future__ import annotations

import base64
import importlib.util
import marshal
import os
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_INTERPRETER = "/usr/bin/python3 -IS"
PACKAGES = ("egpu", "runtime_hook")
# The modules the hook may import (bundle.py and zipapp.py build it; they are not in it).
MODULES = ("egpu", "egpu.card_roster", "egpu.contract", "egpu.driver_limits", "egpu.records",
           "egpu.region_layout", "egpu.safefile",
           "runtime_hook",
           "runtime_hook.hostfs",
           "runtime_hook.main", "runtime_hook.mounts", "runtime_hook.oci", "runtime_hook.plan",
           "runtime_hook.rootfs")

LOADER = '''
import sys
import _frozen_importlib as _bootstrap
import _frozen_importlib_external as _external
from binascii import a2b_base64
from marshal import loads


class _BundleFinder:
    """Imports the bundled modules (code for {magic!r}, else compiled from the source)."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name not in _SOURCE:
            return None
        return _bootstrap.ModuleSpec(name, cls, origin="egpu-hook:" + name,
                                     is_package=name in _PACKAGES)

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        name = module.__spec__.name
        if _external.MAGIC_NUMBER == _MAGIC:
            code = loads(a2b_base64(_CODE[name]))
        else:
            from zlib import decompress

            code = compile(decompress(a2b_base64(_SOURCE[name])), "egpu-hook:" + name, "exec")
        exec(code, module.__dict__)


sys.meta_path.insert(0, _BundleFinder)
from runtime_hook.main import main  # noqa: E402

main()
'''


def _source_path(module: str) -> Path:
    base = ROOT.joinpath(*module.split("."))
    return base / "__init__.py" if module in PACKAGES else base.with_suffix(".py")


def render(interpreter: str = DEFAULT_INTERPRETER) -> str:
    """The text of the hook file."""
    magic = importlib.util.MAGIC_NUMBER
    code: dict[str, str] = {}
    source: dict[str, str] = {}
    for module in MODULES:
        text = _source_path(module).read_bytes()
        compiled = compile(text, f"egpu-hook:{module}", "exec", dont_inherit=True, optimize=0)
        code[module] = base64.b64encode(marshal.dumps(compiled)).decode()
        source[module] = base64.b64encode(zlib.compress(text, 9)).decode()
    lines = [f"#!{interpreter}",
             "# egpu-hook: the egpu OCI runtime hook, built by runtime_hook.bundle. Do not edit.",
             f"_MAGIC = {magic!r}",
             f"_PACKAGES = {set(PACKAGES)!r}",
             "_CODE = {",
             *(f"    {k!r}: {v!r}," for k, v in code.items()),
             "}",
             "_SOURCE = {",
             *(f"    {k!r}: {v!r}," for k, v in source.items()),
             "}",
             LOADER.replace("{magic!r}", repr(f"{sys.version_info[0]}.{sys.version_info[1]}"))]
    return "\n".join(lines)


def build(target: str, interpreter: str = DEFAULT_INTERPRETER) -> Path:
    """Write the hook file to ``target`` (replaced atomically, mode 0755); returns its path."""
    out = Path(target)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(render(interpreter))
    tmp.chmod(0o755)
    os.replace(tmp, out)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m runtime_hook.bundle OUT")
    print(build(sys.argv[1]))
