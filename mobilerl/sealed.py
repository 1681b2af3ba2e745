"""Files sealed at rest: every file written through :func:`write_bytes` under a folder registered with
:func:`seal` is encrypted (Fernet: AES-128-CBC + HMAC-SHA256), mode 0600, and named ``<name>.enc``.

Why: RL keeps each episode's screenshots (``rl.work/screens``) so the update can rebuild the prompts the policy
saw; they show the device's personal data and cannot be masked (the pixels are the policy's input), so they are
sealed with the run's key (``rl.state_key``, the key of ``state.enc``), as the replay buffer's records are.
:func:`open_image` and :func:`read_bytes` open sealed and plain files alike. The registry is per process: a
process that writes or reads a sealed folder registers it first (the trainer and each rollout worker do).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

SUFFIX = ".enc"
_SEALED: dict[Path, bytes] = {}  # registered folder (absolute) -> its Fernet key


def seal(root: str | os.PathLike, key: bytes) -> Path:
    """Files written under ``root`` from now on (in this process) are sealed with ``key``; returns ``root``."""
    _SEALED[Path(root).absolute()] = key
    return Path(root)


def _key(path: Path) -> bytes | None:
    p = path.absolute()
    return next((k for root, k in _SEALED.items() if p.is_relative_to(root)), None)


def write_private(path: Path, write: Any) -> None:
    """``write(tmp)`` then rename: a reader never sees half a file; mode 0600 from the start."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.close(fd)
    write(tmp)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """``data`` to ``path`` (parents made), or sealed to ``path.enc`` under a registered folder; the path written."""
    from cryptography.fernet import Fernet

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = _key(path)
    if key is None:
        path.write_bytes(data)
        return path
    out = path.with_name(path.name + SUFFIX)
    write_private(out, lambda tmp: tmp.write_bytes(Fernet(key).encrypt(data)))
    return out


def read_bytes(path: str | os.PathLike) -> bytes:
    """The content of a plain file, or of a sealed one (``*.enc``) under a folder registered in this process;
    ``ValueError`` naming the file when it is sealed and cannot be opened."""
    from cryptography.fernet import Fernet, InvalidToken

    path = Path(path)
    if path.suffix != SUFFIX:
        return path.read_bytes()
    key = _key(path)
    if key is None:
        raise ValueError(f"{path}: sealed, and no key is registered for its folder in this process")
    try:
        return Fernet(key).decrypt(path.read_bytes())
    except InvalidToken:
        raise ValueError(f"{path}: cannot be opened with the run's key (another key, or changed since it was "
                         "written)") from None


def open_image(path: str | os.PathLike) -> Any:
    """The image in a plain or sealed file, as RGB (loaded: the file is closed)."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(read_bytes(path))) as im:
        return im.convert("RGB")
