"""Build the runtime hook as one self-contained file: ``python -m runtime_hook.zipapp OUT``.

The result is a Python zip application (PEP 441) holding ``runtime_hook`` and the two core
modules it uses (``egpu.contract``, ``egpu.records``), with the shebang
``#!/usr/bin/python3 -IS``: isolated mode and no ``site`` import, so that it starts in a few
tens of milliseconds and depends on nothing but the node's python3 (>= 3.11). Each module is
also stored compiled (``<module>.pyc``, unchecked-hash, for the building interpreter's
version; another version falls back to the sources, slower). The node
DaemonSet's init container installs it as ``/usr/local/egpu/bin/egpu-hook``.
"""

from __future__ import annotations

import py_compile
import shutil
import sys
import tempfile
import zipapp
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = ("egpu/__init__.py", "egpu/contract.py", "egpu/records.py")
DEFAULT_INTERPRETER = "/usr/bin/python3 -IS"


def build(target: str, interpreter: str = DEFAULT_INTERPRETER) -> Path:
    """Write the zipapp to ``target`` (made executable); returns its path."""
    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp)
        (staging / "egpu").mkdir()
        for module in MODULES:
            shutil.copy2(ROOT / module, staging / module)
        shutil.copytree(ROOT / "runtime_hook", staging / "runtime_hook",
                        ignore=shutil.ignore_patterns("__pycache__", "zipapp.py"))
        (staging / "__main__.py").write_text("from runtime_hook.main import main\nmain()\n")
        for source in staging.rglob("*.py"):
            if source.name != "__main__.py":  # zipimport reads <module>.pyc beside the source
                py_compile.compile(str(source), cfile=f"{source}c", doraise=True,
                                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        zipapp.create_archive(staging, target, interpreter=interpreter)
    return Path(target)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m runtime_hook.zipapp OUT")
    print(build(sys.argv[1]))
