"""The tiny Qwen2-VL-architecture model of the embedded default: built from a config, saved and loaded in
Hugging Face format, offline.

The text side is a small Qwen2 decoder (the part that must learn to read screens); the vision tower is
kept tiny but present (one block, 32-dim patches, a handful of image tokens per screenshot) so that
screenshots go through exactly the ``Qwen2VLProcessor`` → ``pixel_values``/``image_grid_thw`` path of the
real models. Nothing is downloaded: the tokenizer is the project's (:mod:`mobilerl.models.tokenizer`).

Pitfalls handled here (``../shared/DEPENDENCIES.md``): bos/eos/pad ids live in ``text_config`` too, and the
``generation_config`` is overridden (its default eos would be Qwen's real id).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Screenshots are downscaled to a few image tokens: max_pixels = 28*28*8 gives ≤ 8 merged tokens.
IMAGE_MIN_PIXELS = 28 * 28 * 2
IMAGE_MAX_PIXELS = 28 * 28 * 8


@dataclass
class TinyShape:
    """Model shape of the tiny profile (``configs/tiny.yaml`` → ``model:``)."""

    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    intermediate_size: int = 768
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = True
    vision_depth: int = 1
    vision_embed_dim: int = 32
    vision_heads: int = 1

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"model.hidden_size ({self.hidden_size}) must be a multiple of model.num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("model.num_attention_heads must be a multiple of model.num_key_value_heads")
        if (self.hidden_size // self.num_attention_heads) % 8:
            raise ValueError("model head dim (hidden_size / num_attention_heads) must be a multiple of 8 (M-RoPE)")


def offline() -> None:
    """Never reach a hub (idempotent)."""
    for k, v in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1")):
        os.environ.setdefault(k, v)


def special_ids(tokenizer: Any) -> dict[str, int]:
    ids = {
        name: tokenizer.convert_tokens_to_ids(tok)
        for name, tok in (
            ("pad", "<|endoftext|>"),
            ("bos", "<|endoftext|>"),
            ("eos", "<|im_end|>"),
            ("image", "<|image_pad|>"),
            ("video", "<|video_pad|>"),
            ("vision_start", "<|vision_start|>"),
            ("vision_end", "<|vision_end|>"),
        )
    }
    missing = [k for k, v in ids.items() if v is None or v == tokenizer.unk_token_id]
    if missing:
        raise ValueError(f"tokenizer lacks the Qwen2-VL special tokens {missing}")
    return ids


def build_config(shape: TinyShape, tokenizer: Any):
    from transformers import Qwen2VLConfig

    ids = special_ids(tokenizer)
    head_dim = shape.hidden_size // shape.num_attention_heads
    half = head_dim // 2  # M-RoPE splits the rotary half-dim into (temporal, height, width) sections
    mrope = [half - 2 * (half // 4), half // 4, half // 4]
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta, "mrope_section": mrope},
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
        tie_word_embeddings=shape.tie_word_embeddings,
    )
    vision = dict(
        depth=shape.vision_depth,
        embed_dim=shape.vision_embed_dim,
        hidden_size=shape.hidden_size,
        num_heads=shape.vision_heads,
        mlp_ratio=2,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
    cfg = Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["image"],
        video_token_id=ids["video"],
        vision_start_token_id=ids["vision_start"],
        vision_end_token_id=ids["vision_end"],
        tie_word_embeddings=shape.tie_word_embeddings,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
    )
    return cfg


def build_model(shape: TinyShape, tokenizer: Any, seed: int = 0):
    """A randomly initialised tiny ``Qwen2VLForConditionalGeneration`` (fp32, sdpa attention)."""
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    torch.manual_seed(seed)
    cfg = build_config(shape, tokenizer)
    model = Qwen2VLForConditionalGeneration._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    set_generation_config(model, tokenizer)
    return model


def set_generation_config(model: Any, tokenizer: Any) -> None:
    ids = special_ids(tokenizer)
    gc = model.generation_config
    gc.bos_token_id, gc.eos_token_id, gc.pad_token_id = ids["bos"], ids["eos"], ids["pad"]
    gc.do_sample, gc.temperature, gc.top_p, gc.top_k = False, None, None, None
    gc.max_new_tokens = 64


def build_processor(tokenizer: Any):
    """``Qwen2VLProcessor`` around the project tokenizer, with screenshots cut to a few image tokens."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor

    from mobilerl.models.tokenizer import CHAT_TEMPLATE

    image = Qwen2VLImageProcessor(min_pixels=IMAGE_MIN_PIXELS, max_pixels=IMAGE_MAX_PIXELS)
    try:
        from transformers import Qwen2VLVideoProcessor

        video = Qwen2VLVideoProcessor(min_pixels=IMAGE_MIN_PIXELS, max_pixels=IMAGE_MAX_PIXELS)
    except Exception:  # noqa: BLE001 — the video processor needs torchvision; images do not
        video = None
    return Qwen2VLProcessor(image_processor=image, tokenizer=tokenizer, video_processor=video,
                            chat_template=CHAT_TEMPLATE)


def n_params(model: Any, text_only: bool = False) -> int:
    if text_only:
        return sum(p.numel() for n, p in model.named_parameters() if "visual" not in n)
    return sum(p.numel() for p in model.parameters())


def save(model: Any, processor: Any, path: Path | str, extra: dict[str, Any] | None = None) -> None:
    """Save model (safetensors), processor and tokenizer in HF format; ``extra`` → ``tiny.json``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    processor.save_pretrained(path)
    if extra is not None:
        (path / "tiny.json").write_text(json.dumps(extra, indent=1, sort_keys=True) + "\n")


def load(path: Path | str, with_processor: bool = True):
    """(model, processor) from a saved directory, offline; the model is in eval mode."""
    offline()
    import torch
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path}/config.json not found: no tiny model saved there")
    model = Qwen2VLForConditionalGeneration.from_pretrained(
        path, attn_implementation="sdpa", dtype=torch.float32, local_files_only=True
    )
    model.eval()
    processor = AutoProcessor.from_pretrained(path, local_files_only=True) if with_processor else None
    return model, processor


def shape_dict(shape: TinyShape) -> dict[str, Any]:
    return asdict(shape)
