"""Model profiles and the LLaMA-Factory arguments built from them (large profiles checked without weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mobilerl.models.profiles import ROOT, available, load_profile
from mobilerl.sft.llamafactory import read_result, train_args


def test_profiles_parse_and_follow_the_paper():
    assert {"tiny", "qwen2_5_vl_7b", "glm4_1v_9b"} <= set(available())
    for name in ("qwen2_5_vl_7b", "glm4_1v_9b"):
        p = load_profile(name)
        assert (p.image_max_pixels, p.image_min_pixels) == (5_000_000, 65_536)  # Table 4
        assert (p.sft.learning_rate, p.sft.min_lr, p.sft.num_train_epochs, p.sft.packing) == (1e-5, 1e-6, 2, True)
        assert (p.rl.learning_rate, p.rl.kl_coef, p.rl.samples_per_task) == (1e-6, 0.001, 16)
        assert (p.rl.adapr_buffer_size, p.rl.adapr_kappa) == (256, 0.25)
        assert json.loads((ROOT / p.sft.deepspeed).read_text())["zero_optimization"]["stage"] == 3
    assert load_profile("qwen2_5_vl_7b").template == "qwen2_vl"
    assert load_profile("glm4_1v_9b").template == "glm4v"
    # the reasoning stages' M: an instruct model behind a loopback server for the large profiles, the embedded
    # teacher on CPU; the budget caps a response (thought + answer)
    for name in ("qwen2_5_vl_7b", "glm4_1v_9b"):
        r = load_profile(name).reasoning
        assert r.teacher["kind"] == "openai" and r.teacher["base_url"].startswith("http://127.0.0.1:")
        assert r.teacher_prompt_style == "full" and r.max_new_tokens == r.think_tokens + r.answer_tokens
    assert load_profile("tiny").reasoning.teacher["kind"] == "sim"


def test_bad_profiles_name_the_key(tmp_path, monkeypatch):
    import mobilerl.models.profiles as profiles

    monkeypatch.setattr(profiles, "PROFILES", tmp_path)
    (tmp_path / "x.yaml").write_text("name: x\nweights: w\ntemplate: t\nimage_max_pixels: 10\n"
                                     "image_min_pixels: 1\nsft: {learning_rate: -1}\n")
    with pytest.raises(ValueError, match=r"sft\.learning_rate"):
        profiles.load_profile("x")
    (tmp_path / "y.yaml").write_text("name: y\nweights: w\ntemplate: t\nimage_max_pixels: 10\n"
                                     "image_min_pixels: 1\nsft: {lerning_rate: 1}\n")
    with pytest.raises(ValueError, match=r"sft\.lerning_rate"):
        profiles.load_profile("y")
    (tmp_path / "z.yaml").write_text("name: z\nweights: w\ntemplate: t\nimage_max_pixels: 10\n"
                                     "image_min_pixels: 1\nreasoning: {teacher: {kind: openai}}\n")
    with pytest.raises(ValueError, match=r"reasoning\.teacher.*base_url"):
        profiles.load_profile("z")
    with pytest.raises(KeyError, match="unknown model profile"):
        profiles.load_profile("nope")


@pytest.mark.parametrize("name", ["tiny", "qwen2_5_vl_7b", "glm4_1v_9b"])
def test_llamafactory_accepts_the_arguments(name, tmp_path):
    """LLaMA-Factory's own parser accepts every profile's SFT arguments (no weights needed). On CPU the
    large profiles' bf16 and DeepSpeed are switched off for the check only."""
    from llamafactory.hparams import get_train_args

    p = load_profile(name)
    args = train_args(p, dataset="mobilerl_sft", dataset_dir=tmp_path, output_dir=tmp_path / "out",
                      model_path=tmp_path / "weights")
    assert args["template"] == p.template and args["packing"] is True
    if name != "tiny":
        assert args["deepspeed"].endswith("zero3.json") and args["bf16"] is True
        args.update(bf16=False, use_cpu=True)
        args.pop("deepspeed")
    _model, data, training, finetuning, _gen = get_train_args(args)
    assert data.template == p.template
    assert data.cutoff_len in (p.sft.cutoff_len, p.sft.cutoff_len - 1)  # packing reserves one token
    assert training.learning_rate == p.sft.learning_rate and training.num_train_epochs == p.sft.num_train_epochs
    assert str(training.lr_scheduler_type).endswith("COSINE_WITH_MIN_LR")
    assert training.lr_scheduler_kwargs == {"min_lr": p.sft.min_lr}
    assert finetuning.freeze_vision_tower == p.sft.freeze_vision_tower


def test_overrides_of_profile_fields_go_through_the_profile(tmp_path):
    """An override named like an ``sft:`` field (``min_lr``) replaces it, validated; other keys pass to
    LLaMA-Factory as they are."""
    from pydantic import ValidationError

    p = load_profile("tiny")
    kw = dict(dataset="d", dataset_dir=tmp_path, output_dir=tmp_path / "out", model_path=tmp_path / "w")
    args = train_args(p, overrides={"learning_rate": 3e-4, "min_lr": 3e-5, "save_steps": 7}, **kw)
    assert args["learning_rate"] == 3e-4 and args["lr_scheduler_kwargs"] == {"min_lr": 3e-5}
    assert "min_lr" not in args and args["save_steps"] == 7
    with pytest.raises(ValidationError, match="min_lr"):
        train_args(p, overrides={"min_lr": 1.0}, **kw)  # above the learning rate


def test_read_result_parses_the_trainer_log(tmp_path):
    (tmp_path / "trainer_log.jsonl").write_text(
        '{"current_steps": 1, "total_steps": 2, "loss": 3.5}\n{"current_steps": 2, "total_steps": 2, "loss": 2.0}\n')
    (tmp_path / "train_results.json").write_text('{"train_runtime": 4.0, "num_input_tokens_seen": 1000}')
    r = read_result(tmp_path)
    assert r.losses == [(1, 3.5), (2, 2.0)] and r.tokens_per_s == 250.0 and r.final_loss < r.first_loss
    (tmp_path / "trainer_log.jsonl").write_text('{"current_steps": 1, "loss": 3.5}\nnot json\n')
    with pytest.raises(ValueError, match=r"trainer_log.jsonl:2"):
        read_result(Path(tmp_path))


def test_generation_dtype_defaults_to_the_training_dtype(tmp_path, monkeypatch):
    """``generation.dtype`` is what the backends run in; without it, the profile's (training) dtype."""
    import mobilerl.models.profiles as profiles
    from mobilerl.models.backends import profile_spec

    monkeypatch.setattr(profiles, "PROFILES", tmp_path)
    base = "weights: w\ntemplate: t\nimage_max_pixels: 10\nimage_min_pixels: 1\ndtype: fp32\n"
    (tmp_path / "a.yaml").write_text("name: a\n" + base)
    (tmp_path / "b.yaml").write_text("name: b\n" + base + "generation: {dtype: bf16}\n")
    (tmp_path / "c.yaml").write_text("name: c\n" + base + "generation: {dtype: int3}\n")
    a, b = profiles.load_profile("a"), profiles.load_profile("b")
    assert (a.inference_dtype, profile_spec(a)["dtype"]) == ("fp32", "fp32")
    assert (b.dtype, b.inference_dtype, profile_spec(b)["dtype"]) == ("fp32", "bf16", "bf16")
    with pytest.raises(ValueError, match=r"generation\.dtype"):
        profiles.load_profile("c")


def test_every_hf_backend_option_is_reachable_from_a_profile(tmp_path, monkeypatch):
    """``generation.hf`` reaches the HFBackend it builds; its fields are the backend's keyword arguments, with its
    defaults; an unknown key there names itself."""
    import inspect

    from tiny_checkpoint import build

    import mobilerl.models.profiles as profiles
    from mobilerl.models.backends import make_backend, profile_spec
    from mobilerl.models.hf_backend import HFBackend
    from mobilerl.models.options import HFOptions

    init = {k: p.default for k, p in inspect.signature(HFBackend.__init__).parameters.items()
            if p.kind is p.KEYWORD_ONLY}
    pretrained = {k for k, p in inspect.signature(HFBackend.from_pretrained).parameters.items()
                  if p.kind is p.KEYWORD_ONLY}
    options = HFOptions.model_fields
    assert set(options) | {"max_batch", "name", "dtype"} == set(init) | pretrained - {"kwargs"}
    assert {k: f.default for k, f in options.items() if k in init} == {k: v for k, v in init.items() if k in options}
    assert all(f.description for f in options.values())

    ckpt = build(tmp_path / "ckpt")
    monkeypatch.setattr(profiles, "PROFILES", tmp_path)
    base = f"weights: {ckpt}\ntemplate: t\nimage_max_pixels: 10\nimage_min_pixels: 1\ndtype: fp32\n"
    (tmp_path / "a.yaml").write_text("name: a\n" + base + "generation: {kind: hf, max_batch: 3, hf: {device: cpu, "
                                     "fast_prefill: false, prefix_cache_tokens: 0, speculate_tokens: 2, "
                                     "batch_draft: 0}}\n")
    (tmp_path / "b.yaml").write_text("name: b\n" + base + "generation: {hf: {prefix_cache_tokns: 5}}\n")
    spec = profile_spec(profiles.load_profile("a"))
    assert "line_token_cache" not in spec  # unset: the backend's default
    backend = make_backend(spec)
    assert isinstance(backend, HFBackend) and backend._text_prefill is None and backend.prefix_cache is None
    assert (backend.speculate_tokens, backend.batch_draft, backend._batcher.max_batch) == (2, 0, 3)
    with pytest.raises(ValueError, match=r"b\.yaml: generation\.hf\.prefix_cache_tokns"):
        profiles.load_profile("b")
