"""The `rl` run's resume state in ``rl.work``: ``config.json`` (the fingerprint of what is trained) and
``state.pt`` (:meth:`mobilerl.rl.trainer.Trainer.state_dict`, written atomically every ``checkpoint_every``
rounds). A run whose fingerprint matches resumes at the checkpoint's round; any other starts afresh."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

# where the episodes run and how the update is spread over processes do not change what is trained: a run resumes
# with a replaced env server, or under another backend / world size
NOT_FINGERPRINTED = {"env_servers", "env_pool", "trainer_backend", "deepspeed_config", "device"}


def save_atomic(obj: Any, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def fingerprint(cfg: Any) -> str:
    return json.dumps({"cfg": cfg.model_dump(exclude=NOT_FINGERPRINTED), "settings": cfg.settings().model_dump()},
                      sort_keys=True)


def resume_or_start(trainer: Any, work: Path) -> bool:
    """Restore ``trainer`` from ``work`` when it holds a checkpoint of the same config (True); else empty
    ``work`` and record the config there (False)."""
    fp = fingerprint(trainer.cfg)
    state_path, config_path = work / "state.pt", work / "config.json"
    if state_path.exists() and config_path.exists() and config_path.read_text() == fp:
        trainer.load_state_dict(torch.load(state_path, weights_only=False))
        log.info("rl: resumed from %s at round %d", state_path, trainer.round)
        return True
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    config_path.write_text(fp)
    return False
