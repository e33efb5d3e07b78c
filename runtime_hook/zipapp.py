"""Former name of the hook's build: ``python -m runtime_hook.zipapp OUT`` now writes the
one-file build of runtime_hook.bundle (not a zip: see there why). Kept so that older install
commands still work."""

from __future__ import annotations

import sys

from runtime_hook.bundle import DEFAULT_INTERPRETER, build

__all__ = ["DEFAULT_INTERPRETER", "build"]

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m runtime_hook.bundle OUT")
    print(build(sys.argv[1]))
