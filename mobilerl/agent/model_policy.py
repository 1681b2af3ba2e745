"""A policy backed by a generation backend: one sampled response per step, with its token ids and
logprobs (what RL's importance ratios need); the step's chat comes from :mod:`mobilerl.agent.prompt`.

Nothing here batches or blocks: episodes run concurrently and each awaits ``backend.generate``, so the
backend (the HF micro-batcher, a vLLM server's scheduler) forms the batches.

Contracts: with ``sampling.seed`` set, step ``t`` of episode ``e`` is sampled with
``stable_seed(sampling.seed, e, t)``, so a response does not depend on its batch mates or their order
(``seed=None``: fresh randomness). At ``temperature=0`` a text-only prompt already answered in the same
episode is answered from memory (same text, ids and logprobs, no model call; docs/evaluation.md).
"""

from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict
from dataclasses import dataclass, field

from mobilerl.agent import prompt
from mobilerl.agent.policy import PolicyContext, PolicyError, PolicyOutput
from mobilerl.env.actions import ActionParseError
from mobilerl.models.generation import ChatRequest, GenerationBackend, SamplingConfig
from mobilerl.seeding import stable_seed


@dataclass
class ModelPolicy:
    """:class:`~mobilerl.agent.policy.Policy` over a :class:`~mobilerl.models.generation.GenerationBackend`.

    Args:
        backend: any generation backend (HF, vLLM, OpenAI-compatible HTTP).
        obs_mode: ``xml`` / ``screenshot`` / ``screenshot+xml`` (screenshot modes need a rendering env).
        sampling: temperature, top-p, max new tokens, stop strings, base seed.
        name / version: recorded in trajectories.
        reasoning: ask for ``<think>`` before the answer (the reasoning system prompt).
        max_history: keep only the last N previous responses in the prompt (None: all).
        prompt_style: ``full`` / ``compact`` system prompt (:func:`mobilerl.agent.prompt.system_prompt`);
            must be the style the checkpoint was trained on (the tiny profile's is ``compact``). ``mobilerl``:
            the official MobileRL chat and observation tree (its released checkpoints; needs ``coords="rel"``,
            its answers being on a 0-999 grid).
        system_prompt: replaces the style's system prompt (e.g. the official harness' own text).
    """

    backend: GenerationBackend
    obs_mode: str = "xml"
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    name: str = "model"
    version: str | None = None
    reasoning: bool = False
    max_history: int | None = None
    prompt_style: str = "full"
    # "rel": the screen and the answers on the 0-999 grid; "marks": numbered lines, taps name a line (index=i);
    # converted back to pixels here
    coords: str = "abs"
    system_prompt: str | None = None
    reuse_greedy: bool = True  # temperature 0: a prompt answered before in this episode is not generated again
    # prompt -> response of this episode (``with_seed`` makes a fresh policy, and memory, per episode)
    _answered: OrderedDict = field(default_factory=OrderedDict, init=False, repr=False, compare=False)
    reused: int = field(default=0, init=False, compare=False)  # responses served from memory

    def __post_init__(self) -> None:
        if self.coords not in prompt.COORD_FRAMES:
            raise ValueError(f"coords must be one of {prompt.COORD_FRAMES}, got {self.coords!r}")
        if self.obs_mode not in prompt.OBSERVATION_MODES:
            raise ValueError(f"obs_mode must be one of {prompt.OBSERVATION_MODES}, got {self.obs_mode!r}")
        if self.prompt_style not in prompt.PROMPT_STYLES:
            raise ValueError(f"prompt_style must be one of {prompt.PROMPT_STYLES}, got {self.prompt_style!r}")
        if self.prompt_style == "mobilerl" and self.coords != "rel":
            raise ValueError(f"prompt_style 'mobilerl' answers on its 0-999 grid: coords must be 'rel', "
                             f"got {self.coords!r}")

    def with_seed(self, seed: int) -> ModelPolicy:
        """This policy with base seed ``seed`` (a :func:`mobilerl.eval.evaluate` policy factory)."""
        return dataclasses.replace(self, sampling=dataclasses.replace(self.sampling, seed=seed))

    def request(self, ctx: PolicyContext) -> ChatRequest:
        """The chat of this step (the prompt module's format) with the screenshot when the mode shows it
        (style ``mobilerl``: the previous screen's too, from the second step on)."""
        if self.prompt_style == "mobilerl":
            messages = prompt.mobilerl_messages_for_context(ctx, mode=self.obs_mode, system=self.system_prompt)
        else:
            messages = prompt.messages_for_context(
                ctx, mode=self.obs_mode, reasoning=self.reasoning, max_history=self.max_history,
                style=self.prompt_style, coords=self.coords,
            )
            if self.system_prompt is not None:
                messages[0] = {"role": "system", "content": self.system_prompt}
        images = None
        if self.obs_mode != "xml":
            shots = [ctx.observation.screenshot]
            if self.prompt_style == "mobilerl" and ctx.history:
                shots.insert(0, ctx.previous.screenshot if ctx.previous is not None else None)
            if any(shot is None for shot in shots):
                raise PolicyError(
                    f"obs_mode {self.obs_mode!r} needs a screenshot, but the env renders none (use a rendering env)"
                )
            images = shots
        return ChatRequest(messages, images)

    async def act(self, ctx: PolicyContext) -> PolicyOutput:
        s = self.sampling
        if s.seed is not None:
            s = dataclasses.replace(s, seed=stable_seed(s.seed, ctx.episode_id, ctx.step))
        req = self.request(ctx)
        key = None
        if self.reuse_greedy and s.temperature == 0 and not req.images:
            key = json.dumps(req.messages, sort_keys=True, default=str)
            if key in self._answered:
                self.reused += 1
                return self._answered[key]
        [gen] = await self.backend.generate([req], s)
        action_text = invalid = None
        if self.coords != "abs":
            size = (ctx.observation.width, ctx.observation.height)
            try:
                if self.prompt_style == "mobilerl":
                    action_text = prompt.mobilerl_action_to_env(gen.text, size)
                else:
                    action_text = prompt.action_to_env(gen.text, size, self.coords, ctx.xml_compressed)
            except ActionParseError as e:
                invalid = str(e) or "unparseable response"  # the rollout records an invalid step
        # A backend that returns no token ids (a plain OpenAI-style server) leaves them unknown, not empty.
        token_ids = list(gen.token_ids) if len(gen.token_ids) == len(gen.logprobs) else None
        out = PolicyOutput(gen.text, list(gen.logprobs), token_ids, action_text=action_text, invalid=invalid)
        if key is not None:
            self._answered[key] = out
            if len(self._answered) > _MAX_ANSWERED:
                self._answered.popitem(last=False)
        return out


_MAX_ANSWERED = 256  # prompts remembered per episode (an episode has at most 50 steps)
