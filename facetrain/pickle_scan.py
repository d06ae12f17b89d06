"""Checks of a pickle's opcodes made before any unpickler sees them (readers of pickled files share them)."""

from __future__ import annotations

import pickletools


def far_memo_index(data: bytes) -> int | None:
    """The first memo slot a PUT opcode names past the pickle's size, or None. A pickler numbers its
    memo from 0, one slot an object, so a real index stays below the byte count; the C unpickler grows
    its memo array to the index named, so `LONG_BINPUT 1562862965` in a 3 KB file asked for 12 GB.
    Scanned with pickletools, which allocates nothing for an index; a scan that stops at a damaged
    opcode leaves the verdict to the unpickler."""
    try:
        for opcode, argument, _ in pickletools.genops(data):
            if opcode.name in ("PUT", "BINPUT", "LONG_BINPUT") and int(argument) >= len(data):
                return int(argument)
            if opcode.name == "STOP":
                return None
    except Exception:  # noqa: BLE001 - any damage is the unpickler's to report, in its own words
        return None
    return None
