"""What every stage shares: its params section as a validated config, paths, JSON output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.yaml"


def repo_path(p: str | Path, root: Path = ROOT) -> Path:
    """A path from params: absolute as given, else relative to the repository."""
    q = Path(p)
    return q if q.is_absolute() else root / q

C = TypeVar("C", bound=BaseModel)


class StageConfig(BaseModel):
    """Base of the stage configs: unknown keys are errors (a typo must not silently use a default)."""

    model_config = ConfigDict(extra="forbid")


class ParamsError(ValueError):
    """params.yaml is missing a section or has a bad key; the message names the key."""


def load_params(section: str, model: type[C], path: Path = PARAMS) -> C:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ParamsError(f"{path} not found") from None
    except yaml.YAMLError as e:
        raise ParamsError(f"{path}: malformed YAML: {e}") from None
    if section not in data:
        raise ParamsError(f"{path}: no '{section}:' section")
    return validate_section(section, model, data[section], path)


def validate_section(section: str, model: type[C], data: Any, source: Path | str = PARAMS) -> C:
    """``data`` (the ``section:`` of params) as ``model``; a ParamsError naming each bad key otherwise."""
    try:
        return model.model_validate(data or {})
    except ValidationError as e:
        raise ParamsError(f"{source}: {problems(section, e)}") from None


def problems(prefix: str, e: ValidationError) -> str:
    """A pydantic error as ``prefix.key.subkey: message; …``."""
    return "; ".join(f"{prefix}.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())


def checked_settings(cfg: Any, section: str = "rl", field: str = "overrides", profile_section: str | None = None
                     ) -> Any:
    """``cfg.settings()``: a model profile's section with the stage's ``field`` applied (the rl stage's
    ``overrides``, :meth:`~mobilerl.rl.config.RLConfig.settings`; the reasoning stages' ``reasoning_overrides``
    over the profile's ``reasoning`` section), a bad value raised as a ParamsError naming ``<section>.<field>.<key>``
    (or the profile's own ``<profile_section>.<key>`` when no override set it; default: ``section``)."""
    try:
        return cfg.settings()
    except ValidationError as e:
        overridden = {k for k, v in (getattr(cfg, field, {}) or {}).items() if v is not None}
        parts = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"])
            where = (f"{section}.{field}.{key}" if str(err["loc"][0]) in overridden
                     else f"the {getattr(cfg, 'profile', '?')!r} profile's {profile_section or section}.{key}")
            parts.append(f"{where}: {err['msg']}")
        raise ParamsError("; ".join(parts)) from None
    except ValueError as e:  # unknown override keys: the message already names rl.overrides
        raise ParamsError(str(e)) from None


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} not found: run the stage that produces it (dvc repro)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: malformed JSON: {e.msg}") from None
