"""The reward model: ``RewardModel.score(trajectories) -> list[float]``, P(the task was completed) per trace.

The judge reads a trace as :mod:`mobilerl.eval.render` draws it (the text form for a text-only profile; the
concatenated screenshots and the action descriptions for a VLM) and answers
``<think>…</think><answer>1|0</answer>`` (``answer="think"``, the paper's format, App. D.3.2) or the bare
``1|0`` (``answer="score"``). One call scores a batch through any generation backend
(:mod:`mobilerl.models.backends`):

- ``samples == 1``: P(yes) from the logprob of the answer digit where the backend names its tokens (the HF
  backend: ``token_text``; greedy decoding gives temperature-1 logprobs), ``exp(lp)`` for a ``1`` and
  ``1 - exp(lp)`` for a ``0`` (the other digit takes the rest of the mass); else the parsed answer as 0 or 1;
- ``samples == k > 1`` (the zero-shot judge through an OpenAI-compatible endpoint): k sampled answers, the score
  is the share of ``1`` votes, so the majority vote is ``score > 0.5`` (a tie is a failure: false positives are
  the judge's costly error, App. E.5).

An answer that does not parse counts as ``0``. :meth:`RewardModel.from_checkpoint` loads a trained judge with the
settings it was trained with (``reward_model.json`` beside the weights); this is what RL calls for a task whose
verifier is hidden.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from mobilerl.eval.render import render_png, text_form
from mobilerl.models.generation import ChatRequest, GenerationBackend, SamplingConfig
from mobilerl.trajectory import Trajectory

SETTINGS_FILE = "reward_model.json"
_ANSWER = re.compile(r"<answer>\s*([01])\s*</answer>")
_BARE = re.compile(r"^\s*([01])\b")

_TASK = ("You judge whether a phone agent completed its task. You are given the task, the agent's actions "
         "and what the screen showed at the end. Judge by the screen, not by what the agent claims.")
SYSTEM = {
    "think": _TASK + " Reason briefly inside <think></think>, then answer <answer>1</answer> if the task was "
                     "completed and <answer>0</answer> if not.",
    "score": _TASK + " Answer 1 if the task was completed and 0 if not.",
}


@dataclass(frozen=True)
class JudgeSettings:
    """How a judge reads a trace and answers: ``answer`` (think | score), ``view`` (text: the text form with the
    last ``screens`` screens' XML; image: the concatenated screenshots and the action descriptions), and the
    ``threshold`` its score is read at."""

    answer: Literal["think", "score"] = "score"
    view: Literal["text", "image"] = "text"
    screens: int = 1
    threshold: float = 0.5  # a score above it is a success (the reward_model stage picks it on the training traces)

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {self.threshold!r}")
        if self.answer not in SYSTEM:
            raise ValueError(f"answer must be one of {sorted(SYSTEM)}, got {self.answer!r}")
        if self.view not in ("text", "image"):
            raise ValueError(f"view must be 'text' or 'image', got {self.view!r}")

    def save(self, model_dir: str | os.PathLike) -> None:
        (Path(model_dir) / SETTINGS_FILE).write_text(json.dumps(asdict(self), indent=1, sort_keys=True) + "\n")

    @classmethod
    def load(cls, model_dir: str | os.PathLike) -> JudgeSettings:
        path = Path(model_dir) / SETTINGS_FILE
        try:
            return cls(**json.loads(path.read_text()))
        except FileNotFoundError:
            raise FileNotFoundError(f"{path} not found: not a reward model directory (run `reward_model`)") from None
        except (json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"{path}: not judge settings ({e})") from None


def judge_messages(traj: Trajectory, settings: JudgeSettings, store_root: str | os.PathLike | None = None
                   ) -> tuple[list[dict[str, str]], list[Any]]:
    """The chat (system + user) that shows ``traj`` to the judge, and its images (the image view: one)."""
    if settings.view == "image":
        image = render_png(traj, store_root)
        user = "<image>\n" + text_form(traj, screens=0)
        return [{"role": "system", "content": SYSTEM[settings.answer]}, {"role": "user", "content": user}], [image]
    return ([{"role": "system", "content": SYSTEM[settings.answer]},
             {"role": "user", "content": text_form(traj, screens=settings.screens)}], [])


def rationale(traj: Trajectory) -> str:
    """The reasoning a ``think`` target states: what the trace shows, read off the trace itself."""
    end = "declares the task done" if traj.finished else "never declares the task done"
    last = traj.steps[-1].app if traj.steps else ""
    return f"The agent takes {traj.n_steps} actions and {end}; the last screen is in {last or 'no app'}."


def target(traj: Trajectory, label: int, answer: str) -> str:
    """The judge's training answer for a trace of ``label`` (1: completed)."""
    return f"<think>{rationale(traj)}</think><answer>{label}</answer>" if answer == "think" else str(label)


def parse_answer(text: str) -> int | None:
    """1 / 0 from ``<answer>1|0</answer>`` or a bare leading digit; None when the text holds neither."""
    m = _ANSWER.search(text) or _BARE.match(text)
    return int(m.group(1)) if m else None


def digit_probability(text: str, token_ids: Sequence[int], logprobs: Sequence[float], token_text: Any
                      ) -> float | None:
    """P(answer = 1) from the logprob of the answer's digit token (the last ``0``/``1`` token), or None."""
    answer = parse_answer(text)
    if answer is None or not token_ids or len(token_ids) != len(logprobs):
        return None
    for tid, lp in zip(reversed(token_ids), reversed(logprobs), strict=True):
        piece = token_text(tid).strip()
        if piece in ("0", "1"):
            p = math.exp(lp)
            return p if int(piece) == 1 else 1.0 - p
    return None


class RewardModel:
    """A judge over a generation backend (see the module docstring)."""

    def __init__(self, backend: GenerationBackend, settings: JudgeSettings | None = None, *, samples: int = 1,
                 temperature: float = 0.0, max_new_tokens: int = 96, seed: int = 0) -> None:
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        if samples > 1 and temperature <= 0:
            raise ValueError("a k-sample vote needs temperature > 0 (greedy samples are all alike)")
        self.backend = backend
        self.settings = settings or JudgeSettings()
        self.threshold = self.settings.threshold
        self.samples = samples
        self.sampling = SamplingConfig(temperature=temperature, seed=seed,
                                       max_new_tokens=max_new_tokens if self.settings.answer == "think" else 4)
        self.unparsed = 0  # answers that named no digit so far (scored 0)

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, backend_spec: dict[str, Any] | None = None,
                        **kwargs: Any) -> RewardModel:
        """The judge trained into ``path`` (its ``reward_model.json`` settings) on the HF backend, or on the
        backend ``backend_spec`` (:func:`~mobilerl.models.backends.make_backend` keys; ``model`` is ``path``)."""
        from mobilerl.models.backends import make_backend

        settings = JudgeSettings.load(path)
        backend = make_backend({"kind": "hf", **(backend_spec or {}), "model": str(path)})
        return cls(backend, settings, **kwargs)

    async def ascore(self, trajectories: Sequence[Trajectory],
                     store_roots: Sequence[str | os.PathLike | None] | None = None) -> list[float]:
        """P(completed) of each trajectory, in order (``store_roots``: where each one's screenshots live)."""
        roots = list(store_roots) if store_roots is not None else [None] * len(trajectories)
        if len(roots) != len(trajectories):
            raise ValueError(f"{len(trajectories)} trajectories but {len(roots)} store roots")
        chats = [await asyncio.to_thread(judge_messages, traj, self.settings, root)
                 for traj, root in zip(trajectories, roots, strict=True)]
        # prompts of like length batched together: padding, not the model, was most of a batch's prefill
        order = sorted(range(len(chats)), key=lambda i: len(chats[i][0][1]["content"]))
        requests = [ChatRequest(chats[i][0], chats[i][1] or None) for i in order for _ in range(self.samples)]
        gens_sorted = await self.backend.generate(requests, self.sampling) if requests else []
        gens = [None] * len(requests)
        for rank, i in enumerate(order):
            gens[i * self.samples:(i + 1) * self.samples] = gens_sorted[rank * self.samples:(rank + 1) * self.samples]
        token_text = getattr(self.backend, "token_text", None)
        scores = []
        for i in range(len(trajectories)):
            votes = gens[i * self.samples:(i + 1) * self.samples]
            if self.samples == 1 and token_text is not None:
                p = digit_probability(votes[0].text, votes[0].token_ids, votes[0].logprobs, token_text)
                if p is not None:
                    scores.append(p)
                    continue
            answers = [parse_answer(g.text) for g in votes]
            self.unparsed += sum(a is None for a in answers)
            scores.append(sum(a == 1 for a in answers) / len(answers))
        return scores

    def score(self, trajectories: Sequence[Trajectory],
              store_roots: Sequence[str | os.PathLike | None] | None = None) -> list[float]:
        """:meth:`ascore` from synchronous code (inside an event loop, ``await ascore`` instead)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.ascore(trajectories, store_roots))
        raise RuntimeError("RewardModel.score() called from a running event loop; await ascore(...) instead")
