"""A random tiny Qwen2-VL checkpoint for backend tests: the project tokenizer trained on a few lines (seconds)
and a smaller-than-default shape, saved in HF format with ``tiny.json`` (so loaders take the tiny path).
Built once per test session (shared by the test modules that import it). And a screenshot-reading variant of the
tiny profile."""

from __future__ import annotations

from pathlib import Path

CORPUS = [
    "Task: open the Contacts app and add Alice\nScreen:\n",
    "Button;clickable;OK;[10,20][300,400]\nTextView;;Contacts;[0,0][999,80]\n",
    'do(action="Tap", element=[10,20,300,400])',
    'do(action="Type", text="hello")',
    'do(action="Swipe", direction="up", dist="medium")',
    'do(action="Launch", app="Contacts")',
    'do(action="Back")',
    'finish(message="done")',
    "<think>I should tap the button.</think><answer>",
]


def build(path: Path) -> Path:
    if (path / "tiny.json").exists():
        return path
    from mobilerl.models import tiny
    from mobilerl.models.tokenizer import train_tokenizer

    tiny.offline()
    tok = train_tokenizer(CORPUS * 20, vocab_size=2048)
    shape = tiny.TinyShape(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, intermediate_size=128
    )
    model = tiny.build_model(shape, tok, seed=0)
    tiny.save(model, tiny.build_processor(tok), path, extra={"shape": tiny.shape_dict(shape), "test": True})
    return path


def session_checkpoint(tmp_path_factory) -> Path:
    return build(tmp_path_factory.getbasetemp() / "tiny-backend-ckpt")


def screenshot_profile(monkeypatch, tmp_path: Path) -> str:
    """``tiny_shots``: the tiny profile in the VLM profiles' observation mode (screenshot+xml) with pixel bounds;
    the profiles folder pointed at a copy that has it (until a tiny VLM profile ships, e.g. vl_smoke)."""
    import yaml

    from mobilerl.models import profiles

    folder = tmp_path / "profiles"
    folder.mkdir(exist_ok=True)
    for p in profiles.PROFILES.glob("*.yaml"):
        (folder / p.name).write_text(p.read_text())
    data = yaml.safe_load((profiles.PROFILES / "tiny.yaml").read_text())
    data["name"] = "tiny_shots"
    data["generation"] |= {"obs_mode": "screenshot+xml", "coords": "abs", "max_new_tokens": 24}
    (folder / "tiny_shots.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setattr(profiles, "PROFILES", folder)
    return "tiny_shots"
