"""RL rollouts through remote engines (``rl.engines``): OpenAI-compatible servers that hold the policy —
``python -m mobilerl.models.serve_openai CKPT --weight-sync`` (the HF backend, CPU or GPU) or the same with
``--engine vllm`` (GPU) — in place of the local rollout workers (:mod:`mobilerl.rl.rollout`).

A round: the trainer's weights go to every engine (:mod:`mobilerl.models.weight_sync`, ``rl.weight_sync``:
``reload`` or ``broadcast``) when their version is new, then the round's episodes run here (the episode runner
and the env pool in this process), each episode's model calls on one engine, engines taken in turn. The
engine samples and returns the token ids and their logprobs (``return_tokens_as_token_ids``; the logprobs are
the engine's, ``log_softmax(logits / T)``), which the steps store as the behaviour policy's, so the trainer's
importance ratio is taken against what the engine computed and ``loss/logprob_gap_max`` measures the
rollout–trainer gap every round. Every completion reports the weights' version it was sampled with; a
completion from any other version than the round's fails the round (it cannot happen after a confirmed push).
The prompt side is re-rendered by the trainer from the stored step with the same tokenizer and chat template
(``mobilerl.rl.batch``): engines must serve a checkpoint with the trainer's tokenizer.

An engine that cannot be reached (after the HTTP client's retries) ends its episodes with an engine failure, which
the round drops and counts (:func:`mobilerl.rl.groups.triage`): an infrastructure failure must never become a
reward of 0; a round whose every episode failed so stops, and the run resumes from its last checkpoint. (The
asynchronous mode also runs such episodes again elsewhere and rejoins restarted engines: :mod:`mobilerl.rl.async_engines`.)
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from mobilerl.env.base import TaskSpec
from mobilerl.env.cluster import EnvServers, merge_stats, server_metrics
from mobilerl.models.generation import ChatRequest, Generation, GenerationError, SamplingConfig
from mobilerl.models.weight_sync import WeightSync, make_weight_sync
from mobilerl.rl.rollout import PolicySpec, kept_screens
from mobilerl.trajectory import Trajectory

log = logging.getLogger(__name__)


class VersionChecked:
    """A generation backend that refuses completions sampled with any other weights than ``version``."""

    def __init__(self, inner: Any, version: str) -> None:
        self.inner, self.version = inner, version
        self.name = getattr(inner, "name", "engine")

    async def generate(self, requests: Sequence[ChatRequest], sampling: SamplingConfig) -> list[Generation]:
        gens = await self.inner.generate(requests, sampling)
        for g in gens:
            if g.policy_version != self.version:
                raise GenerationError(f"{getattr(self.inner, 'base_url', 'engine')} sampled with policy version "
                                      f"{g.policy_version}, the round's is {self.version}")
        return gens


class RemoteEngines:
    """The rollout side of the trainer over remote engines; ``run`` has :class:`RolloutWorkers`' signature.

    Args:
        urls: the engines' API roots.
        spec: the policy's prompt and sampling settings (``init``, ``backend``, ``threads`` are the engines').
        model: the trainer's model (pushed by ``sync``).
        sync: the weight sync to the same engines.
        gathered: a context in which ``model`` holds its whole weights (the trainer's: ZeRO-3 shards them).
        api_key: the engines' Bearer token.
    """

    pushes_weights = True  # the trainer writes no weights file for these workers: ``sync`` moves the weights

    def __init__(self, urls: Sequence[str], spec: PolicySpec, model: torch.nn.Module, sync: WeightSync,
                 api_key: str | None = None, timeout_s: float = 300.0, env_servers: EnvServers | None = None,
                 gathered: Callable[[], AbstractContextManager[Any]] | None = None,
                 env_factory: Callable[[], Any] | None = None, screens: Path | None = None) -> None:
        import contextlib

        self.screens = screens  # where episodes keep their screenshots (screenshot modes: the update rereads them)
        self._calls = itertools.count()
        self.urls, self.spec, self.model, self.sync = list(urls), spec, model, sync
        self.gathered = gathered or contextlib.nullcontext
        self.env_servers = env_servers  # episodes on env servers across hosts (None: the in-process simulator)
        self.env_factory = env_factory  # or on the envs it builds (AndroidWorld's servers)
        self._env_stats: dict[str, dict[str, Any]] = {}
        self.api_key, self.timeout_s = api_key, timeout_s
        self.version: int | None = None  # what the engines serve (None: unknown before the first push)
        self._push: dict[str, float] = {}  # the last push's seconds per engine

    def run(self, tasks: Sequence[TaskSpec], n: int | Sequence[int], base_seed: int, weights: Path | None = None,
            version: int = 0) -> tuple[list[Trajectory], float]:
        """``n`` episodes of every task, in (task, trial) order, with the trainer's current weights as
        ``version`` (``weights``, the local workers' file, is not used). The first call pushes whatever the
        engines were started with: they may serve another checkpoint. Returns the trajectories and the push's
        seconds."""
        t0 = time.perf_counter()
        if version != self.version:
            with self.gathered():
                self._push = self.sync.push(self.model, version)
            self.version = version
            log.info("rl: weights v%d on %d engine(s): %s", version, len(self.urls),
                     {k: round(v, 3) for k, v in self._push.items()})
        sync_s = time.perf_counter() - t0
        trajs = asyncio.run(self._rollouts(tasks, n, base_seed, str(version)))
        if self.env_servers is not None:
            self._env_stats = merge_stats([self.env_servers.take_stats()])
        return trajs, sync_s

    async def _rollouts(self, tasks: Sequence[TaskSpec], n: int | Sequence[int], base_seed: int, version: str) -> list[Trajectory]:
        from mobilerl.agent.model_policy import ModelPolicy
        from mobilerl.eval.runner import evaluate
        from mobilerl.models.openai_backend import OpenAIBackend

        s = self.spec
        clients = [OpenAIBackend(u, api_key=self.api_key, timeout=self.timeout_s, max_concurrency=s.concurrency,
                                 name="adagrpo") for u in self.urls]
        sampling = SamplingConfig(temperature=s.temperature, max_new_tokens=s.max_new_tokens, seed=0)
        policies = [ModelPolicy(VersionChecked(c, version), obs_mode=s.obs_mode, name="adagrpo", version=version,
                                reasoning=s.reasoning, max_history=s.max_history, prompt_style=s.prompt_style,
                                coords=s.coords, reuse_greedy=False, sampling=sampling) for c in clients]
        turn = itertools.count()  # an episode stays on one engine (its prompts share prefixes there)

        def factory(seed: int) -> ModelPolicy:
            return policies[next(turn) % len(policies)].with_seed(seed)

        try:
            shots = None if self.screens is None else self.screens / f"d{version}" / f"c{next(self._calls)}"
            return await evaluate(factory, tasks, n_trials=n, base_seed=base_seed, progress=False, obs_mode=s.obs_mode,
                                  concurrency=s.concurrency * len(clients), env_servers=self.env_servers,
                                  env_factory=self.env_factory, keep_screenshots_dir=shots,
                                  **({"call_timeout": None} if self.env_factory is not None else {}))
        finally:
            for c in clients:
                await c.aclose()

    def metrics(self) -> dict[str, float]:
        """The last round's per-server figures (``envs/<server>/<figure>``, with env servers) and the seconds of
        its weight push to each engine (``sync/<engine>_s``)."""
        return {**server_metrics(self._env_stats), **{f"sync/{k}_s": v for k, v in self._push.items()}}

    def close(self) -> None:
        self.sync.close()

    def __enter__(self) -> RemoteEngines:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def engines_api_key(cfg: Any) -> str | None:
    """The engines' API key, from the environment variable ``rl.engines_api_key_env`` names (None: no key)."""
    if not cfg.engines_api_key_env:
        return None
    api_key = os.environ.get(cfg.engines_api_key_env)
    if not api_key:
        raise ValueError(f"rl.engines_api_key_env: environment variable {cfg.engines_api_key_env!r} is not set")
    return api_key


def remote_engines(cfg: Any, spec: PolicySpec, trainer: Any, work: Path) -> RemoteEngines:
    """:class:`RemoteEngines` for an :class:`~mobilerl.rl.config.RLConfig` with ``engines`` set, pushing
    ``trainer``'s model; the reload transport writes into ``work/weights`` (on a filesystem the engines share)."""
    api_key = engines_api_key(cfg)
    sync = make_weight_sync(cfg.weight_sync, cfg.engines, directory=work / "weights", address=cfg.sync_address,
                            api_key=api_key)
    envs = EnvServers(cfg.env_servers, cfg.env_pool) if cfg.env_servers else None
    from mobilerl.env.factory import env_factory, renders

    aw = None
    if cfg.androidworld is not None:
        aw = env_factory("androidworld", obs_mode=spec.obs_mode, androidworld=cfg.androidworld)
    return RemoteEngines(cfg.engines, spec, trainer.model, sync, api_key=api_key, env_servers=envs,
                         gathered=trainer.gathered, env_factory=aw,
                         screens=kept_screens(cfg, work)[0] if renders(spec.obs_mode) else None)
