"""Weights built from a profile's ``random_init:`` section: no download, nothing large committed.

    path = ensure_weights(load_profile("vl_smoke"))   # .cache/models/vl_smoke, built on first use

The model is the section's ``architecture`` (the large profile's class: Qwen2.5-VL) at a tiny size, randomly
initialised under ``seed`` around the project tokenizer (``models/tiny-base``'s, which has Qwen2-VL's special
tokens), saved in HF format with its processor (the profile's pixel bounds) and a generation config whose
special ids are the tokenizer's. It has no ``tiny.json``: loaders take the path of the large profiles
(``AutoModelForImageTextToText``), not the tiny base's.

Built on first use rather than by a DVC stage: the weights are a pure function of the profile file, which every
stage that reads them already depends on (``configs/models``), and a stage would run for every pipeline run,
whatever its profile. The folder records what it was built from (``random_init.json``: the section, the pixel
bounds, the tokenizer's hash), so an edited section is rebuilt and an unchanged one reused; a build goes to a
sibling folder renamed into place, so two stages starting at once never read a half-written one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from mobilerl.models.profiles import ROOT, ModelProfile, RandomInit

RECORD = "random_init.json"


def _record(spec: RandomInit, profile: ModelProfile) -> dict[str, Any]:
    tok = (_repo(spec.tokenizer) / "tokenizer.json").read_bytes()
    return {"random_init": spec.model_dump(), "image_min_pixels": profile.image_min_pixels,
            "image_max_pixels": profile.image_max_pixels, "tokenizer_sha256": hashlib.sha256(tok).hexdigest()}


def _repo(p: str) -> Path:
    return Path(p) if Path(p).is_absolute() else ROOT / p


def ensure_weights(profile: ModelProfile) -> Path:
    """The profile's weight directory; with ``random_init``, built there first unless it holds exactly that build."""
    path = profile.weights_path
    spec = profile.random_init
    if spec is None:
        return path
    record = _record(spec, profile)
    if _built_from(path) == record:
        return path
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    build(spec, profile, tmp)
    (tmp / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    if _built_from(path) == record:  # another process finished the same build meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
        return path
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return path


def _built_from(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((path / RECORD).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def random_like(base: Path, where: Path, seed_offset: int = 1) -> Path | None:
    """A second draw of the build ``base`` was made from (its seed + ``seed_offset``) at ``where``; None when
    ``base`` was not built from a config."""
    record = _built_from(base)
    if record is None:
        return None
    spec = RandomInit.model_validate(record["random_init"])
    spec = spec.model_copy(update={"seed": spec.seed + seed_offset})
    shutil.rmtree(where, ignore_errors=True)
    bounds = {"image_min_pixels": record["image_min_pixels"], "image_max_pixels": record["image_max_pixels"]}
    build(spec, bounds, where)
    (where / RECORD).write_text(json.dumps({**record, "random_init": spec.model_dump()}, indent=1,
                                           sort_keys=True) + "\n")
    return where


def build(spec: RandomInit, profile: ModelProfile | dict[str, int], out: Path) -> None:
    """Build and save the model, processor and tokenizer of ``spec`` into ``out`` (pixel bounds from ``profile``)."""
    import torch
    from transformers import (
        AutoTokenizer,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
    )

    from mobilerl.models import tiny
    from mobilerl.models.tokenizer import CHAT_TEMPLATE

    tiny.offline()
    bounds = profile if isinstance(profile, dict) else {"image_min_pixels": profile.image_min_pixels,
                                                        "image_max_pixels": profile.image_max_pixels}
    tok = AutoTokenizer.from_pretrained(_repo(spec.tokenizer), local_files_only=True)
    ids = tiny.special_ids(tok)
    half = spec.hidden_size // spec.num_attention_heads // 2  # M-RoPE: (temporal, height, width) of the half-dim
    text = dict(vocab_size=len(tok), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
                num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
                num_key_value_heads=spec.num_key_value_heads, max_position_embeddings=spec.max_position_embeddings,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [half - 2 * (half // 4), half // 4, half // 4]},
                bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"], tie_word_embeddings=True)
    # window attention in every block but the last, which sees the whole image (the 7B: every eighth)
    vision = dict(depth=spec.vision_depth, hidden_size=spec.vision_hidden_size,
                  intermediate_size=spec.vision_intermediate_size, num_heads=spec.vision_heads,
                  out_hidden_size=spec.hidden_size, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                  window_size=112, fullatt_block_indexes=[spec.vision_depth - 1])
    cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=ids["image"],
                           video_token_id=ids["video"], vision_start_token_id=ids["vision_start"],
                           vision_end_token_id=ids["vision_end"], tie_word_embeddings=True, bos_token_id=ids["bos"],
                           eos_token_id=ids["eos"], pad_token_id=ids["pad"])
    torch.manual_seed(spec.seed)
    model = Qwen2_5_VLForConditionalGeneration._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    tiny.set_generation_config(model, tok)
    image = Qwen2VLImageProcessor(min_pixels=bounds["image_min_pixels"], max_pixels=bounds["image_max_pixels"])
    try:
        from transformers import Qwen2VLVideoProcessor

        video = Qwen2VLVideoProcessor(min_pixels=bounds["image_min_pixels"], max_pixels=bounds["image_max_pixels"])
    except Exception:  # noqa: BLE001 — the video processor needs torchvision; images do not
        video = None
    processor = Qwen2_5_VLProcessor(image_processor=image, tokenizer=tok, video_processor=video,
                                    chat_template=CHAT_TEMPLATE)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)
