"""The `rl` run's resume state in ``rl.work``, safe at rest: ``config.json`` (the fingerprint of what is trained),
``state.pt`` (round, model and optimiser tensors: loaded with ``weights_only=True``, so a planted file cannot run
code) and ``state.enc`` (the replay buffers', curriculum's and hooks' records as JSON, encrypted with Fernet:
AES-128-CBC + HMAC-SHA256), both written atomically, mode 0600, every ``checkpoint_every`` rounds.

Why encrypted rather than masked: a replayed trajectory must give the update the exact tokens the policy saw
(its prompts are rebuilt from the stored instruction and screens), so its personal data cannot be replaced. The
key lives outside ``rl.work`` (``rl.state_key``, created 0600 on first use): a leaked or left-behind work folder
reveals nothing, and a file that was tampered with or sealed with another key is refused with its name. A run
whose fingerprint matches resumes at the checkpoint's round; any other starts afresh.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from mobilerl.sealed import write_private

log = logging.getLogger(__name__)

# where the episodes run and how the update is spread over processes do not change what is trained: a run resumes
# with a replaced env server or engine (Ray gives them new ports), or under another backend / world size / device
NOT_FINGERPRINTED = {"env_servers", "env_pool", "engines", "engines_api_key_env", "cluster", "ray", "trainer_backend",
                     "deepspeed_config", "device", "state_key", "log_episodes_every"}
TENSORS = ("round", "model", "optimizer")  # state.pt; everything else of the state goes to state.enc
STATE, RECORDS = "state.pt", "state.enc"


def state_key(path: str | os.PathLike) -> bytes:
    """The Fernet key in ``path`` (``~`` expanded), made (0600, folder 0700) when missing."""
    from cryptography.fernet import Fernet

    p = Path(path).expanduser()
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_private(p, lambda tmp: tmp.write_bytes(Fernet.generate_key()))
    return p.read_bytes().strip()


def save_state(state: dict[str, Any], work: Path, key: bytes) -> None:
    """:meth:`Trainer.state_dict` into ``work``: its tensors to state.pt, its records sealed to state.enc."""
    from cryptography.fernet import Fernet

    records = json.dumps({k: v for k, v in state.items() if k not in TENSORS}).encode()
    write_private(work / RECORDS, lambda tmp: tmp.write_bytes(Fernet(key).encrypt(records)))
    write_private(work / STATE, lambda tmp: torch.save({k: state[k] for k in TENSORS}, tmp))


def load_state(work: Path, key: bytes) -> dict[str, Any]:
    """The state :func:`save_state` wrote; ``ValueError`` naming the file when it cannot be read safely."""
    from cryptography.fernet import Fernet, InvalidToken

    try:
        tensors = torch.load(work / STATE, weights_only=True)
    except Exception as e:  # noqa: BLE001 - an unpickling refusal or a corrupt file: either way not ours
        raise ValueError(f"{work / STATE}: not a resume state of this code ({type(e).__name__}: {e})") from None
    try:
        records = json.loads(Fernet(key).decrypt((work / RECORDS).read_bytes()))
    except (InvalidToken, OSError, ValueError) as e:
        raise ValueError(f"{work / RECORDS}: cannot be opened with rl.state_key (another key, or changed since "
                         f"it was written: {type(e).__name__})") from None
    return {**records, **tensors}


def fingerprint(cfg: Any) -> str:
    return json.dumps({"cfg": cfg.model_dump(exclude=NOT_FINGERPRINTED), "settings": cfg.settings().model_dump()},
                      sort_keys=True)


def resume_or_start(trainer: Any, work: Path) -> bool:
    """Restore ``trainer`` from ``work`` when it holds a checkpoint of the same config (True); else empty
    ``work`` and record the config there (False)."""
    fp = fingerprint(trainer.cfg)
    config_path = work / "config.json"
    if (work / STATE).exists() and config_path.exists() and config_path.read_text() == fp:
        trainer.load_state_dict(load_state(work, state_key(trainer.cfg.state_key)))
        log.info("rl: resumed from %s at round %d", work, trainer.round)
        return True
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    os.chmod(work, 0o700)
    config_path.write_text(fp)
    return False


def remove_state(work: Path) -> None:
    """The resume state is gone once the run has written its policy (it can no longer be resumed), with the
    screenshots its trajectories kept."""
    import shutil

    for name in (STATE, RECORDS, "policy.safetensors"):
        (work / name).unlink(missing_ok=True)
    shutil.rmtree(work / "screens", ignore_errors=True)  # = mobilerl.rl.rollout.SCREENS
