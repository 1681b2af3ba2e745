"""scripts/gpu_check.sh's CPU side: the script parses, and its VLM-path check (scripts/vl_check.py) resolves its
profile (vl_smoke, else the tiny profile reading screenshots), checkpoint, engine command and rl config in dry mode;
the GPU runs themselves need a lent GPU machine."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_parses_and_the_vl_check_plans_without_a_gpu(tmp_path, monkeypatch):
    from mobilerl.models import profiles

    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_check.sh")], check=True)
    monkeypatch.setattr(profiles, "PROFILES", profiles.PROFILES)  # the fallback repoints it: undone after the test
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import vl_check

    assert vl_check.main(["--dry", "--out", str(tmp_path / "vl.json"), "--profile", "no_such_profile"]) == 0
    report = json.loads((tmp_path / "vl.json").read_text())
    plan = report["plan"]
    assert plan["profile"] == "tiny_screenshots" and "no profile 'no_such_profile'" in plan["fallback"]
    assert plan["obs_mode"] == "screenshot+xml" and Path(plan["ckpt"], "config.json").is_file()
    engine = report["engine"]
    assert engine[engine.index("--engine") + 1] == "vllm" and "--weight-sync" in engine
    rl = report["rl"]
    assert rl["async"] == {"max_staleness": 1} and rl["engines"] and rl["env_servers"]
    # the rl config is what the rl stage validates: valid, or the tree's own reason (async without engines yet)
    assert report["rl_valid"] is True or "rl.async" in report["rl_valid"]
