"""JSON for the hook without importing the ``json`` package (which imports ``re`` and ``enum``:
about 15 ms of a hook run on a busy node).

``loads`` drives CPython's C scanner (``_json.make_scanner``, the very scanner ``json.loads``
uses) directly, so that a document it accepts gives exactly ``json.loads``'s result. Anything
it does not accept (a malformed document, a BOM, UTF-16, another Python) goes to ``json.loads``
itself, which returns the same value or raises its usual error: the behaviour is
``json.loads``'s in every case, only the common case is cheaper.

``dumps_indented`` writes what ``json.dumps(value, indent=1)`` writes, for the types the hook
writes (dict with str keys, list, tuple, str, int, bool, None, float).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

try:  # CPython's accelerator of the json package; absent on other implementations
    from _json import encode_basestring_ascii as _quote
    from _json import make_scanner as _make_scanner
except ImportError:  # pragma: no cover - not CPython
    _make_scanner = None
    _quote = None

_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}
_WHITESPACE = " \t\n\r"


class _Context:
    """The attributes ``_json.make_scanner`` reads (those of a default json.JSONDecoder)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


_scan = _make_scanner(_Context()) if _make_scanner is not None else None


def _slow_loads(text: str | bytes) -> Any:
    import json

    return json.loads(text)


def loads(text: str | bytes) -> Any:
    """``json.loads(text)``: same result, same exceptions (json.JSONDecodeError, a
    ValueError, on malformed input; TypeError for a non-text argument)."""
    if _scan is None or not isinstance(text, str | bytes):
        return _slow_loads(text)
    if isinstance(text, bytes):
        if text[:3] == b"\xef\xbb\xbf" or b"\x00" in text[:4]:
            return _slow_loads(text)  # BOM or UTF-16/32: json.detect_encoding's business
        try:
            doc = text.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            return _slow_loads(text)
    else:
        doc = text
    start = len(doc) - len(doc.lstrip(_WHITESPACE))
    try:
        value, end = _scan(doc, start)
    except (StopIteration, ValueError):
        return _slow_loads(text)  # raises json's own error
    if end != len(doc) and doc[end:].strip(_WHITESPACE):
        return _slow_loads(text)  # extra data: raises json's error
    return value


def _encode(value: object, level: int, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(_quote(value) if _quote is not None else _slow_dumps(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(_slow_dumps(value))  # NaN / Infinity spelled as json spells them
    elif isinstance(value, list | tuple):
        if not value:
            out.append("[]")
            return
        inner = "\n" + " " * (level + 1)
        out.append("[")
        for i, item in enumerate(value):
            out.append(inner if i == 0 else "," + inner)
            _encode(item, level + 1, out)
        out.append("\n" + " " * level + "]")
    elif isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        inner = "\n" + " " * (level + 1)
        out.append("{")
        for i, (key, item) in enumerate(value.items()):
            if not isinstance(key, str):
                raise TypeError(f"keys must be str, not {type(key).__name__}")
            out.append(inner if i == 0 else "," + inner)
            _encode(key, level + 1, out)
            out.append(": ")
            _encode(item, level + 1, out)
        out.append("\n" + " " * level + "}")
    else:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _slow_dumps(value: object) -> str:
    import json

    return json.dumps(value)


def dumps_indented(value: object) -> str:
    """``json.dumps(value, indent=1)`` for dict/list/tuple/str/int/bool/None/float."""
    out: list[str] = []
    _encode(value, 0, out)
    return "".join(out)
