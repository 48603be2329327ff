"""Environment knobs read on hot paths.

The packages read their knobs where they decide, every call: a few dozen reads per training step.
``os.environ.get`` of an unset name costs about a microsecond on the development CPU (the key is
encoded, then the Mapping protocol raises and catches a KeyError). :func:`get` encodes each name once
and looks it up in the mapping behind ``os.environ``, the dict that its ``__setitem__`` and
``__delitem__`` update, so ``monkeypatch.setenv``, ``mock.patch.dict`` and ``os.environ[k] = v`` are
seen at once: about 0.1 µs. Where ``os.environ`` lacks that mapping, or was replaced by another
object, it falls back to ``os.environ.get``.
"""

from __future__ import annotations

import os

__all__ = ["get"]

_ENVIRON = os.environ
_DATA = getattr(_ENVIRON, "_data", None)
_ENCODE = getattr(_ENVIRON, "encodekey", None)
_DECODE = getattr(_ENVIRON, "decodevalue", None)
_FAST = isinstance(_DATA, dict) and callable(_ENCODE) and callable(_DECODE)
_KEYS: dict[str, object] = {}


def get(name: str, default: str | None = None) -> str | None:
    """``os.environ.get(name, default)``, without its cost for unset names."""
    if not _FAST or os.environ is not _ENVIRON:
        return os.environ.get(name, default)
    key = _KEYS.get(name)
    if key is None:
        key = _KEYS[name] = _ENCODE(name)
    value = _DATA.get(key)
    return default if value is None else _DECODE(value)
