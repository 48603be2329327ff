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

__all__ = ["get", "snapshot"]

_ENVIRON = os.environ
_DATA = getattr(_ENVIRON, "_data", None)
_ENCODE = getattr(_ENVIRON, "encodekey", None)
_DECODE = getattr(_ENVIRON, "decodevalue", None)
_FAST = isinstance(_DATA, dict) and callable(_ENCODE) and callable(_DECODE)
_KEYS: dict[str, object] = {}
_KEY_TUPLES: dict[tuple[str, ...], tuple] = {}


def get(name: str, default: str | None = None) -> str | None:
    """``os.environ.get(name, default)``, without its cost for unset names."""
    if not _FAST or os.environ is not _ENVIRON:
        return os.environ.get(name, default)
    key = _KEYS.get(name)
    if key is None:
        key = _KEYS[name] = _ENCODE(name)
    value = _DATA.get(key)
    return default if value is None else _DECODE(value)


def snapshot(names: tuple[str, ...]) -> tuple:
    """The current values of ``names`` as one tuple, None where unset: a cache key for choices made
    from those knobs (equal tuples, equal knobs). The values are in ``os.environ``'s internal
    encoding, so compare snapshots with each other only."""
    if not _FAST or os.environ is not _ENVIRON:
        return tuple(map(os.environ.get, names))
    keys = _KEY_TUPLES.get(names)
    if keys is None:
        keys = _KEY_TUPLES[names] = tuple(map(_ENCODE, names))
    return tuple(map(_DATA.get, keys))
