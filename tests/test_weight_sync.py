"""Trainer → rollout-engine weight sync on CPU: the project's OpenAI-compatible HF server as the engine, pushes by
checkpoint reload and by gloo broadcast, then the engine's sampled logprobs equal the trainer's for the same tokens;
bad pushes refused with the old weights kept; completions report the version that sampled them; the vLLM adapter
against a stand-in for vLLM's engine; the server's CLI; the rl loop through remote engines."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import torch
from tiny_checkpoint import session_checkpoint

from mobilerl.models import tiny
from mobilerl.models.generation import ChatRequest, SamplingConfig
from mobilerl.models.hf_backend import HFBackend
from mobilerl.models.openai_backend import OpenAIBackend
from mobilerl.models.serve_openai import ServerThread
from mobilerl.models.weight_server import TorchEngineWeights, WeightServer
from mobilerl.models.weight_sync import (
    BroadcastSync,
    ReloadSync,
    WeightSyncError,
    make_weight_sync,
    model_schema,
    named_tensors,
)
from mobilerl.rl.batch import Row, collate, rows_logprobs

ROOT = Path(__file__).resolve().parents[1]
SCREEN = "Task: open the Contacts app\nScreen:\nButton;clickable;OK;[10,20][300,400]\n"
REQUESTS = [ChatRequest([{"role": "user", "content": SCREEN + s}]) for s in ("", "Back\n", "Home\n")]
SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=12, seed=5)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return session_checkpoint(tmp_path_factory)


class Engine:
    """An HF engine served with the weight endpoints on 127.0.0.1 (prefix cache on: a push must drop it)."""

    def __init__(self, ckpt: Path) -> None:
        self.backend = HFBackend.from_pretrained(ckpt, device="cpu", max_batch=8, batch_wait_ms=5)
        self.weights = WeightServer(TorchEngineWeights(self.backend))
        self.server = ServerThread(self.backend, model_name="tiny", weights=self.weights).start()
        self.url = self.server.base_url

    def state(self) -> dict:
        return httpx.get(f"{self.url}/weights").json()

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in named_tensors(self.backend.model)}

    def close(self) -> None:
        self.server.stop()


@pytest.fixture(scope="module")
def engines(ckpt):
    es = [Engine(ckpt), Engine(ckpt)]
    yield es
    for e in es:
        e.close()


def trainer_model(ckpt: Path, seed: int, scale: float = 0.05):
    """The trainer's copy of the policy after an 'update': every tensor moved by seeded noise."""
    model, processor = tiny.load(ckpt)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval(), processor


def sampled_gap(url: str, model, processor) -> tuple[float, set[str | None]]:
    """Sample through the engine at T = 1 and return the largest |engine logprob - trainer logprob| over the
    sampled tokens (the trainer's teacher-forced recompute of the RL update) and the versions reported."""
    gens = asyncio.run(OpenAIBackend(url, max_retries=0).generate(REQUESTS, SAMPLING))
    return _gap(gens, REQUESTS, model, processor), {g.policy_version for g in gens}


def _gap(gens, requests, model, processor) -> float:
    tb = HFBackend(model, processor, prefix_cache_tokens=0)
    rows = [Row(tb.prompt_ids(r), g.token_ids, g.logprobs, 0.0) for r, g in zip(requests, gens, strict=True)]
    assert all(r.response_ids for r in rows)
    b = collate(rows, tb.pad_id)
    with torch.no_grad():
        lp, _ = rows_logprobs(model, b, SAMPLING.temperature)
    return float(((lp - b["behaviour_logprobs"]).abs() * b["response_mask"]).max())


@pytest.mark.parametrize("transport", ["reload", "broadcast"])
def test_a_push_makes_every_engine_serve_the_trainers_weights(engines, ckpt, tmp_path, transport):
    urls = [e.url for e in engines]
    assert all(e.backend.prefix_cache is not None for e in engines)  # a push must make it forget old keys
    first, processor = trainer_model(ckpt, seed=1)
    before, _ = sampled_gap(urls[0], first, processor)
    assert before > 0.05, "the perturbed trainer must differ from the engine for this test to mean anything"
    with make_weight_sync(transport, urls, directory=tmp_path, address="127.0.0.1:0") as sync:
        for version, seed in ((11, 1), (12, 2)):  # two pushes: the broadcast group is formed once and reused
            model, _ = trainer_model(ckpt, seed=seed)
            timings = sync.push(model, version)
            assert timings["sync/s"] > 0 and timings["sync/bytes"] > 1e6
            for url in urls:
                gap, versions = sampled_gap(url, model, processor)
                assert gap < 1e-4, f"{transport}: engine {url} logprobs differ from the trainer's by {gap}"
                assert versions == {str(version)}
            assert [e.state()["version"] for e in engines] == [version, version]
            if transport == "broadcast":
                assert all(e.state()["group"]["world_size"] == 3 for e in engines)
                prefix = {e.state()["group"]["prefix"] for e in engines}
                if version == 11:
                    first_prefix = prefix
                assert prefix == first_prefix  # not re-formed for the second push
    if transport == "reload":
        assert [p.name for p in tmp_path.iterdir()] == ["policy.safetensors"]  # written atomically, no leftovers


def test_bad_pushes_are_refused_by_name_and_the_engine_keeps_its_weights(engines, ckpt, tmp_path):
    from safetensors.torch import save_file

    engine = engines[0]
    good, _ = trainer_model(ckpt, seed=3)
    with ReloadSync([engine.url], tmp_path / "ok") as sync:
        sync.push(good, 21)
    kept = engine.snapshot()
    tensors = {k: v.contiguous() for k, v in named_tensors(good)}
    name = "model.language_model.layers.0.mlp.up_proj.weight"

    def post(path, body):
        return httpx.post(f"{engine.url}{path}", json=body)

    def unchanged() -> None:
        now = engine.snapshot()
        assert all(torch.equal(now[k], kept[k]) for k in kept)
        assert engine.state()["version"] == 21

    cases = {
        "unknown": ({**tensors, "model.extra.weight": torch.zeros(2)}, "unknown parameter.*model.extra.weight"),
        "shape": ({**tensors, name: torch.zeros(3, 3)}, f"{name}: shape \\[3, 3\\]"),
        "missing": ({k: v for k, v in tensors.items() if k != name}, f"missing parameter.*{name}"),
    }
    for case, (content, message) in cases.items():
        path = tmp_path / f"{case}.safetensors"
        save_file(content, str(path))
        r = post("/weights", {"path": str(path), "version": 22})
        assert r.status_code == 400 and re.search(message, r.json()["error"]["message"]), (case, r.text)
        unchanged()
    r = post("/weights", {"path": str(tmp_path / "absent.safetensors"), "version": 22})
    assert r.status_code == 400 and "not found on the engine" in r.json()["error"]["message"]
    assert post("/weights", {"path": str(path), "version": -1}).status_code == 400
    unchanged()

    # broadcast: no group yet -> 409; a wrong shape -> 400 before any tensor moves
    params = [{"name": k, "dtype": "float32", "shape": list(v.shape)} for k, v in tensors.items()]
    assert post("/weights/update", {"version": 23, "params": params}).status_code == 409
    bad = [dict(p, shape=[1]) if p["name"] == name else p for p in params]
    r = post("/weights/update", {"version": 23, "params": bad})
    assert r.status_code == 400 and name in r.json()["error"]["message"]
    bigger = tiny.build_model(tiny.TinyShape(hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                             num_key_value_heads=4, intermediate_size=128),
                              tiny.load(ckpt)[1].tokenizer, seed=0)
    with BroadcastSync([engine.url], group_timeout_s=30) as sync:
        with pytest.raises(WeightSyncError, match="missing parameter.*layers.2|unknown parameter.*layers.2"):
            sync.push(bigger, 24)  # refused by the trainer's check against the engine's schema
        unchanged()
        # a transfer that breaks off after the engine accepted it: the engine reports it and keeps its weights
        sync.connect()
        assert post("/weights/update", {"version": 25, "params": params}).status_code == 202
        sync.group.close()
        sync.group = None
        state = httpx.get(f"{engine.url}/weights?wait=true", timeout=60).json()
        assert state["status"] == "error" and state["version"] == 21 and state["group"] is None
        unchanged()
        sync.push(good, 26)  # the next push forms a new group
    assert engine.state()["version"] == 26 and engine.state()["status"] == "ready"


def test_each_completion_reports_the_weights_that_sampled_it(engines, ckpt):
    """Requests in flight while a push lands: each answer's logprobs are those of the version it reports."""
    engine = engines[1]
    models = {str(v): trainer_model(ckpt, seed=v) for v in (31, 32)}
    processor = models["31"][1]
    with ReloadSync([engine.url], ckpt.parent / "sync-31") as sync:
        sync.push(models["31"][0], 31)
        pusher = threading.Thread(target=lambda: (time.sleep(0.3), sync.push(models["32"][0], 32)))
        pusher.start()
        seen: list[tuple[ChatRequest, object]] = []

        async def waves() -> None:
            client = OpenAIBackend(engine.url, max_retries=0)
            for _ in range(60):
                gens = await client.generate(REQUESTS * 3, SAMPLING)
                seen.extend(zip(REQUESTS * 3, gens, strict=True))
                if gens[-1].policy_version == "32":
                    break
            await client.aclose()

        asyncio.run(waves())
        pusher.join()
    versions = {g.policy_version for _, g in seen}
    assert versions == {"31", "32"}, versions
    for v in versions:
        mine = [(r, g) for r, g in seen if g.policy_version == v]
        gap = _gap([g for _, g in mine], [r for r, _ in mine], models[v][0], processor)
        assert gap < 1e-4, f"answers reporting version {v} were sampled with other weights (gap {gap})"


class FakeVLLMWorker:
    """What vLLM's worker gives the extension: ``rank``, ``device``, ``model_runner.get_model()`` with a
    ``load_weights`` that copies Hugging Face-named tensors in (vLLM's loader maps and shards them)."""

    fail_after: int | None = None  # raise after loading this many tensors (a load that breaks off)

    def __init__(self, model) -> None:
        self.rank, self.device = 0, torch.device("cpu")
        tensors = dict(named_tensors(model))

        def load_weights(weights):
            with torch.no_grad():
                for i, (name, t) in enumerate(weights):
                    if self.fail_after is not None and i == self.fail_after:
                        raise RuntimeError("CUDA error: an illustrative failure half-way through a load")
                    tensors[name].copy_(t)

        self.model_runner = SimpleNamespace(get_model=lambda: SimpleNamespace(load_weights=load_weights))


class FakeLLM:
    """``vllm.LLM``'s two calls the adapter uses: ``collective_rpc`` (here: one worker, in process) and
    ``reset_prefix_cache``."""

    def __init__(self, model) -> None:
        from mobilerl.models.vllm_weights import WorkerExtension

        worker_cls = type("Worker", (FakeVLLMWorker, WorkerExtension), {})
        self.workers = [worker_cls(model)]
        self.resets = 0

    def collective_rpc(self, method, args=()):
        args = json.loads(json.dumps(args))  # what crosses vLLM's process boundary: plain values
        return [getattr(w, method)(*args) for w in self.workers]

    def reset_prefix_cache(self) -> None:
        self.resets += 1


def test_the_vllm_adapter_runs_the_protocol_against_a_stand_in_engine(ckpt, tmp_path):
    from mobilerl.models.vllm_weights import VLLMEngineWeights, hf_schema

    served = HFBackend.from_pretrained(ckpt, device="cpu", max_batch=8)
    llm = FakeLLM(served.model)
    adapter = VLLMEngineWeights(SimpleNamespace(llm=llm), ckpt)
    assert adapter.schema() == model_schema(served.model) == hf_schema(ckpt)  # the meta model's names
    with ServerThread(served, weights=WeightServer(adapter)) as srv:
        for transport, version in (("reload", 41), ("broadcast", 42)):
            model, processor = trainer_model(ckpt, seed=version)
            with make_weight_sync(transport, [srv.base_url], directory=tmp_path, address="127.0.0.1:0") as sync:
                sync.push(model, version)
            gap, versions = sampled_gap(srv.base_url, model, processor)
            assert gap < 1e-4 and versions == {str(version)}
        assert llm.resets == 2  # the prefix cache is dropped after each push
        bad = tmp_path / "bad.safetensors"
        from safetensors.torch import save_file

        save_file({"visual.nope": torch.zeros(1)}, str(bad))
        r = httpx.post(f"{srv.base_url}/weights", json={"path": str(bad), "version": 43})
        assert r.status_code == 400 and "visual.nope" in r.json()["error"]["message"]
        assert httpx.get(f"{srv.base_url}/weights").json()["version"] == 42  # refused before the load
        # a load that breaks off half-way: some tensors are new, so no version is claimed until the next push
        llm.workers[0].fail_after = 10
        model, processor = trainer_model(ckpt, seed=44)
        with ReloadSync([srv.base_url], tmp_path) as sync:
            with pytest.raises(WeightSyncError, match="half-way"):
                sync.push(model, 44)
            state = httpx.get(f"{srv.base_url}/weights").json()
            assert state["version"] == -1 and "push again" in state["error"]
            assert sampled_gap(srv.base_url, model, processor)[1] == {"-1"}
            llm.workers[0].fail_after = None
            sync.push(model, 45)
        assert sampled_gap(srv.base_url, model, processor)[1] == {"45"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_serve_openai_weight_sync_from_the_command_line(ckpt, tmp_path):
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "mobilerl.models.serve_openai", str(ckpt), "--port", str(port),
                             "--weight-sync", "--device", "cpu"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert httpx.get(f"{url}/weights").json()["version"] == 0
        for transport, version in (("reload", 1), ("broadcast", 2)):
            model, processor = trainer_model(ckpt, seed=50 + version)
            with make_weight_sync(transport, [url], directory=tmp_path, address="127.0.0.1:0") as sync:
                sync.push(model, version)
            gap, versions = sampled_gap(url, model, processor)
            assert gap < 1e-4 and versions == {str(version)}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_rl_config_names_bad_engine_settings():
    from mobilerl.rl.config import RLConfig

    assert RLConfig().engines is None  # default: the local rollout workers
    for bad in ([], ["127.0.0.1:8000"]):
        with pytest.raises(ValueError, match="rl.engines"):
            RLConfig(engines=bad)
    with pytest.raises(ValueError, match="weight_sync"):
        RLConfig(engines=["http://127.0.0.1:8000"], weight_sync="ftp")


@pytest.mark.parametrize("transport", ["reload", "broadcast"])
def test_rl_rounds_roll_out_through_remote_engines(tmp_path, transport):
    """Two AdaGRPO rounds on the tiny base with the rollouts on an HF engine: each round's episodes are sampled
    by the trainer's weights of that round (their stored logprobs are the trainer's) and record its version."""
    from mobilerl.env.sim.tasks import list_tasks
    from mobilerl.rl.batch import PromptFormat, trajectory_rows
    from mobilerl.rl.config import RLConfig
    from mobilerl.rl.engine import remote_engines
    from mobilerl.rl.loop import train
    from mobilerl.rl.rollout import PolicySpec
    from mobilerl.rl.trainer import Trainer

    base = ROOT / "models" / "tiny-base"
    engine = HFBackend.from_pretrained(base, device="cpu", max_batch=8)
    fmt = PromptFormat(obs_mode="xml", prompt_style="compact", max_history=4, coords="marks")
    tasks = [dataclasses.replace(t, complexity=0.3) for t in list_tasks("world", "train", n=1)][:2]
    with ServerThread(engine, weights=WeightServer(TorchEngineWeights(engine))) as srv:
        cfg = RLConfig(init=str(base), rounds=2, engines=[srv.base_url], weight_sync=transport,
                       overrides={"train_batch_size": 2, "samples_per_task": 2, "max_new_tokens": 16,
                                  "learning_rate": 1e-3, "kl_coef": 0.0})
        tb = HFBackend.from_pretrained(base, device="cpu", prefix_cache_tokens=0)
        trainer = Trainer(cfg, tb.model, tb.prompt_ids, tb.pad_id, fmt)
        spec = PolicySpec(init=str(base), backend={}, obs_mode="xml", prompt_style="compact", max_history=4,
                          coords="marks", reasoning=False, temperature=1.0, max_new_tokens=16, concurrency=8)
        rounds: list[tuple[int | None, set, float]] = []
        with remote_engines(cfg, spec, trainer, tmp_path / "work") as workers:
            run = workers.run

            def checked_run(tasks, n, base_seed, weights=None, version=0):
                if version == 1:  # whatever round 0's update did, round 1's weights must differ from round 0's
                    with torch.no_grad():
                        for p in trainer.model.parameters():
                            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(7)) * 0.02)
                trajs, sync_s = run(tasks, n, base_seed, weights, version)
                rows = [r for t in trajs for r in trajectory_rows(t, 1.0, fmt, tb.prompt_ids)]
                b = collate(rows, tb.pad_id)
                with torch.no_grad():
                    lp, _ = rows_logprobs(trainer.model, b, 1.0)
                gap = float(((lp - b["behaviour_logprobs"]).abs() * b["response_mask"]).max())
                rounds.append((workers.version, {t.policy_version for t in trajs}, gap))
                return trajs, sync_s

            workers.run = checked_run
            curve = train(trainer, workers, tasks, tmp_path / "work", progress=False)
        assert [c["round"] for c in curve] == [0, 1]
        assert [(v, pv) for v, pv, _ in rounds] == [(0, {"0"}), (1, {"1"})]
        assert all(gap < 1e-4 for _, _, gap in rounds), rounds
        assert all(c["time/sync_s"] > 0 for c in curve)
        assert not (tmp_path / "work" / "policy.safetensors").exists()  # no file for local workers written
