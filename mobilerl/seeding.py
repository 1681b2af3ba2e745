"""Integer seeds derived from names (task ids, episode ids, steps), equal in every process and run.

Python's ``hash`` of a string changes with ``PYTHONHASHSEED``, so seeds are hashes of the parts' text.
:func:`stable_seed` is the one to use. :func:`sim_seed` is the simulator's own, kept as it is because the
simulator is defined by it: every device's content, every task's parameters and the fixed test
variations (task id -> seed) come from it, so changing it would change every task and every result.
"""

from __future__ import annotations

import hashlib
import zlib


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from any parts: blake2b of their ``str`` joined by ``|``."""
    h = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") >> 1


def sim_seed(*parts: object) -> int:
    """The simulator's 31-bit seed from any parts: crc32 of their ``str`` joined by ``/``."""
    return zlib.crc32("/".join(str(p) for p in parts).encode()) & 0x7FFFFFFF
