"""Trajectories → token rows for the update, and the trainer's logprobs of those rows.

A row is one model turn: the prompt the policy saw at that step (rebuilt from the stored step exactly as
:meth:`~mobilerl.agent.model_policy.ModelPolicy.request` built it: task, every previous response, the step's
compressed screen and, in the screenshot modes, its screenshot, which the rollout kept as a file), the sampled
token ids and their behaviour logprobs (stored by the rollout), and the trajectory's advantage. Logprobs are
recomputed with :func:`mobilerl.models.logprobs.token_logprobs` on a right-padded batch, so the ratio
π_θ/π_behaviour starts at 1 on-policy (checked by a test to 1e-4). A row's screenshots are read again when its
micro-batch is collated (the ``vision`` encoder: the backend's image processor), never held by the rows: at the
large profiles' resolution a screenshot's pixel values are ~100 MB.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mobilerl import sealed
from mobilerl.agent import prompt
from mobilerl.models.generation import ChatRequest
from mobilerl.models.logprobs import token_logprobs
from mobilerl.rl.loss import entropy_from_logits
from mobilerl.trajectory import Trajectory


@dataclass(frozen=True)
class PromptFormat:
    """How the policy prompted (the profile's generation settings); the rebuild must use the same."""

    obs_mode: str = "xml"
    prompt_style: str = "compact"
    max_history: int | None = 4
    coords: str = "marks"
    reasoning: bool = False


@dataclass
class Row:
    prompt_ids: list[int]
    response_ids: list[int]
    behaviour_logprobs: list[float]
    advantage: float
    on_policy: bool = True  # False for an AdaPR replay (sampled by an older policy)
    ref_logprobs: list[float] | None = None  # under the frozen reference policy, once computed
    images: tuple[str, ...] = ()  # the prompt's screenshot files, in prompt order (screenshot modes)


Vision = Callable[[Sequence[str]], dict[str, torch.Tensor]]  # image files -> pixel_values, image_grid_thw


def load_image(path: str) -> Any:
    """A kept screenshot as the policy saw it (RGB; PNG is lossless, so the pixels are the env's; sealed or not)."""
    return sealed.open_image(path)


def step_requests(traj: Trajectory, fmt: PromptFormat, images: bool = True) -> list[ChatRequest]:
    """The chat request of every step of ``traj``; in the screenshot modes with the step's kept screenshot
    (``images=False``: the placeholder only, the files named by :func:`step_images`)."""
    if fmt.prompt_style == "mobilerl":
        raise ValueError("RL rebuilds prompts in the full / compact styles; prompt_style mobilerl (the official "
                         "harness' chat, for evaluating its released checkpoints) is not one RL trains")
    size = traj.meta.get("screen_size") or (1080, 2400)
    shots = step_images(traj, fmt)
    out = []
    for t, step in enumerate(traj.steps):
        history = [s.response for s in traj.steps[:t]]
        messages = prompt.build_messages(
            traj.instruction, history, prompt.screen_in_frame(step.xml_compressed, size, fmt.coords), app=step.app,
            mode=fmt.obs_mode, reasoning=fmt.reasoning, max_history=fmt.max_history, style=fmt.prompt_style,
            coords=fmt.coords)
        out.append(ChatRequest(messages, [load_image(p) for p in shots[t]] if shots[t] and images else None))
    return out


def step_images(traj: Trajectory, fmt: PromptFormat) -> list[tuple[str, ...]]:
    """Each step's screenshot files (empty in the XML mode); ``ValueError`` when a screenshot mode's step kept
    none (the rollout must keep them: :class:`~mobilerl.rl.rollout.PolicySpec` ``screens``)."""
    if fmt.obs_mode == "xml":
        return [() for _ in traj.steps]
    missing = [s.index for s in traj.steps if not s.screenshot_path]
    if missing:
        raise ValueError(f"{traj.episode_id}: obs_mode {fmt.obs_mode!r} shows screenshots, but steps {missing[:5]} "
                         "kept none; RL needs the rollouts' screenshots to rebuild their prompts")
    return [(str(s.screenshot_path),) for s in traj.steps]


def trajectory_rows(traj: Trajectory, advantage: float, fmt: PromptFormat,
                    prompt_ids: Callable[[ChatRequest], list[int]], on_policy: bool = True) -> list[Row]:
    """One row per step that carries its sampled token ids and logprobs (invalid answers included: their
    tokens were the policy's action too); reference logprobs from ``traj.meta["ref_logprobs"]`` when a
    previous round stored them there (a replayed trajectory's are fixed: the reference policy is frozen)."""
    rows = []
    shots = step_images(traj, fmt)
    for step, req, files in zip(traj.steps, step_requests(traj, fmt), shots, strict=True):
        if not step.token_ids or step.logprobs is None:
            continue
        rows.append(Row(prompt_ids(req), list(step.token_ids), list(step.logprobs), float(advantage), on_policy,
                        images=files))
    cached = traj.meta.get("ref_logprobs")
    if cached is not None and len(cached) == len(rows):
        for row, ref in zip(rows, cached, strict=True):
            row.ref_logprobs = ref
    return rows


def micro_batches(rows: Sequence[Row], max_tokens: int) -> list[list[Row]]:
    """Rows grouped (longest first) so that a batch's padded forward stays within ``max_tokens``. Rows with the
    same prompt and response ids (a confident policy repeats itself; replays repeat earlier rounds) share one
    forward, so they go into the same batch and count once."""
    same: dict[tuple[Any, ...], list[Row]] = {}
    for r in rows:
        same.setdefault(row_key(r), []).append(r)
    batches: list[list[list[Row]]] = []
    for group in sorted(same.values(), key=lambda g: -_width(g[0])):
        # longest first: a batch's first sequence sets its padded width
        if batches and (len(batches[-1]) + 1) * _width(batches[-1][0][0]) <= max_tokens:
            batches[-1].append(group)
        else:
            batches.append([group])
    return [[r for group in b for r in group] for b in batches]


def row_key(r: Row) -> tuple[tuple[int, ...], tuple[int, ...], tuple[str, ...]]:
    """What makes two rows one forward: the same ids and the same screenshots."""
    return tuple(r.prompt_ids), tuple(r.response_ids), r.images



def _width(r: Row) -> int:
    return len(r.prompt_ids) + len(r.response_ids)


def collate(rows: Sequence[Row], pad_id: int, device: torch.device | str | None = None,
            vision: Vision | None = None) -> dict[str, torch.Tensor]:
    """The forward over the U distinct sequences of ``rows``: right-padded ``input_ids``/``attention_mask``
    (U, L), ``positions`` (U, R) of the tokens that predict each response token, ``response_ids`` (U, R), and
    when the rows show screenshots ``pixel_values`` / ``image_grid_thw`` of the sequences' images in order (from
    ``vision``). Per row: ``seq`` (B,) the index of its sequence, ``behaviour_logprobs`` and ``response_mask``
    (B, R), ``advantages`` and ``on_policy`` (B,), and ``ref_logprobs`` (B, R) when every row has them; on
    ``device`` (the model's) when given."""
    index: dict[tuple[Any, ...], int] = {}
    seq = [index.setdefault(row_key(r), len(index)) for r in rows]
    uniq = {i: r for r, i in zip(rows, seq, strict=True)}
    uniq_rows = [uniq[i] for i in range(len(index))]
    width = max(_width(r) for r in uniq_rows)
    resp = max(len(r.response_ids) for r in rows)
    u, b = len(uniq_rows), len(rows)
    ids = torch.full((u, width), pad_id, dtype=torch.long)
    mask = torch.zeros((u, width), dtype=torch.long)
    pos = torch.zeros((u, resp), dtype=torch.long)
    rid = torch.full((u, resp), pad_id, dtype=torch.long)
    for i, r in enumerate(uniq_rows):
        full = r.prompt_ids + r.response_ids
        ids[i, : len(full)] = torch.tensor(full)
        mask[i, : len(full)] = 1
        k = len(r.response_ids)
        pos[i, :k] = torch.arange(len(r.prompt_ids) - 1, len(full) - 1)
        rid[i, :k] = torch.tensor(r.response_ids)
    old = torch.zeros((b, resp))
    ref = torch.zeros((b, resp))
    rmask = torch.zeros((b, resp))
    for i, r in enumerate(rows):
        k = len(r.response_ids)
        old[i, :k] = torch.tensor(r.behaviour_logprobs)
        if r.ref_logprobs is not None:
            ref[i, :k] = torch.tensor(r.ref_logprobs)
        rmask[i, :k] = 1
    out = {"input_ids": ids, "attention_mask": mask, "positions": pos, "response_ids": rid,
           "seq": torch.tensor(seq, dtype=torch.long), "behaviour_logprobs": old, "response_mask": rmask,
           "advantages": torch.tensor([r.advantage for r in rows], dtype=torch.float32),
           "on_policy": torch.tensor([r.on_policy for r in rows])}
    if all(r.ref_logprobs is not None for r in rows):
        out["ref_logprobs"] = ref  # (B, R)
    files = [f for r in uniq_rows for f in r.images]
    if files:
        if vision is None:
            raise ValueError("the rows show screenshots, but no vision encoder was given to collate them")
        out.update(vision(files))
    return out if device is None else {k: v.to(device) for k, v in out.items()}


def response_logits(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Logits (U, R, V) at the positions that predict each response token: the decoder's hidden states there
    through the LM head only (the prompt's other positions need no vocabulary projection). With screenshots the
    model places the image tokens and derives the M-RoPE positions from the image grid, as in generation."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    if "pixel_values" in batch:
        kinds = (ids == model.config.image_token_id).int()  # mm_token_type_ids: 1 on image tokens, 0 on text
        hidden = model.model(input_ids=ids, attention_mask=mask, pixel_values=batch["pixel_values"],
                             image_grid_thw=batch["image_grid_thw"], mm_token_type_ids=kinds).last_hidden_state
    else:
        position_ids = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0).expand_as(ids)
        hidden = model.model(input_ids=ids, attention_mask=mask, position_ids=position_ids).last_hidden_state
    pos = batch["positions"]
    picked = hidden.gather(1, pos.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))  # (U, R, H)
    return model.lm_head(picked)


class ResponseLogits(torch.nn.Module):
    """:func:`response_logits` of ``policy`` as a module's forward, for a wrapper that must run every forward
    itself: DeepSpeed's engine (ZeRO-3 gathers parameters and counts micro-steps there)."""

    takes_batch = True  # rows_logprobs calls it with the batch; the engine passes the attribute through

    def __init__(self, policy: Any) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return response_logits(self.policy, batch)


def rows_logprobs(model: Any, batch: dict[str, torch.Tensor], temperature: float,
                  entropy: bool = False, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logprobs (B, R), entropy (B, R) or None)`` of every row's response tokens under ``model`` (the policy,
    or a :class:`ResponseLogits` / an engine around one) at ``temperature`` (the rollout's: behaviour logprobs
    are log_softmax(logits / T)); one forward per distinct sequence, spread to its rows (their gradients add up).
    ``entropy_grad``: the entropy keeps its graph (an entropy bonus), at the memory of a second (B, T, V)."""
    logits = model(batch) if getattr(model, "takes_batch", False) else response_logits(model, batch)
    logp = token_logprobs(logits, batch["response_ids"], temperature)[batch["seq"]]
    if not entropy:
        return logp, None
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        ent = entropy_from_logits((logits if entropy_grad else logits.detach()) / temperature)[batch["seq"]]
    return logp, ent


@torch.no_grad()
def rows_policy_stats(model: Any, rows: Sequence[Row], pad_id: int, temperature: float,
                      max_tokens: int, vision: Vision | None = None) -> tuple[list[list[float]], list[list[float]]]:
    """Each row's token logprobs and token entropies under ``model`` (no gradient), in ``rows`` order: what
    DART's entropy selection and DistRL's Retrace traces and priorities read before the update."""
    where = {id(r): i for i, r in enumerate(rows)}
    logps: list[list[float]] = [[] for _ in rows]
    ents: list[list[float]] = [[] for _ in rows]
    device = next(model.parameters()).device
    for mb in micro_batches(rows, max_tokens):
        lp, ent = rows_logprobs(model, collate(mb, pad_id, device, vision), temperature, entropy=True)
        for r, a, e in zip(mb, lp.tolist(), ent.tolist(), strict=True):
            k = len(r.response_ids)
            logps[where[id(r)]], ents[where[id(r)]] = a[:k], e[:k]
    return logps, ents
