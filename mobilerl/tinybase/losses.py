"""The tiny base's training loss: weighted next-token cross-entropy plus the copy head's two extra losses.

- LM loss: ``sum(w_t · CE_t) / sum(w_t)``, ``w = 1`` on answer tokens and ``data.lm_weight`` on other text
  tokens; logits are only computed where ``w > 0``.
- Attention supervision (``train.attn_sup``): the NLL of the attention of the first heads of one layer, at the
  position predicting a copied answer token, on that token's source in the prompt (``Encoded.attn_pairs``).
- Copy readout (``train.copy_readout``): what that head writes from the source, read out alone through
  ``lm_head``, scored against the copied token.

Why: a tiny model trained on the LM loss alone copies spans poorly; pointing a head at the source and training
its value path lifted held-out span copy most (docs/tiny_base.md). Both are training signals only: the
model's architecture and forward are unchanged. The queries, keys and values are captured by a wrapper around
transformers' SDPA attention.
"""

from __future__ import annotations

from typing import Any

_CAPTURE_ATTN = "mobilerl_sdpa_capture"


def _capturing_sdpa(module: Any, query: Any, key: Any, *args: Any, **kwargs: Any):
    """transformers' SDPA attention that also keeps the (post-RoPE) queries and keys of a module marked
    with a ``_mobilerl_capture`` dict, for :func:`attention_loss`."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cap = getattr(module, "_mobilerl_capture", None)
    if cap is not None:
        cap["q"], cap["k"] = query, key
        cap["v"] = args[0] if args else kwargs.get("value")
    return sdpa_attention_forward(module, query, key, *args, **kwargs)


def text_decoder(model: Any) -> Any:
    """The text decoder of a Qwen2-VL (``model.model.language_model``) or of a plain Qwen2 LM (``model.model``)."""
    return getattr(model.model, "language_model", model.model)


def decoder_layers(model: Any) -> Any:
    return text_decoder(model).layers


def enable_attention_capture(model: Any, layer: int) -> dict[str, Any]:
    """Route the model's attention through :func:`_capturing_sdpa` and mark decoder ``layer``; returns the
    dict its queries, keys and values land in on every forward. Outputs are unchanged (it is SDPA)."""
    from transformers import AttentionInterface

    AttentionInterface.register(_CAPTURE_ATTN, _capturing_sdpa)
    model.set_attn_implementation(_CAPTURE_ATTN)
    attn = decoder_layers(model)[layer].self_attn
    if getattr(attn, "_mobilerl_capture", None) is None:
        attn._mobilerl_capture = {}
    return attn._mobilerl_capture


def disable_attention_capture(model: Any) -> None:
    for m in decoder_layers(model):
        m.self_attn._mobilerl_capture = None
    model.set_attn_implementation("sdpa")


def attention_loss(q: Any, k: Any, pairs: Any, heads: int, scaling: float) -> tuple[Any, float]:
    """Mean NLL of the attention of ``heads`` heads at each pair's query position on its key position.

    ``q``, ``k``: (B, H, T, D) post-RoPE (no grouped-query attention); ``pairs``: (N, 3) row, query, key.
    Returns (loss, share of (pair, head) whose top-attended position is the key)."""
    import torch

    losses, hits, n = [], 0, 0
    for b in pairs[:, 0].unique().tolist():
        sel = pairs[pairs[:, 0] == b]
        qp, kp = sel[:, 1], sel[:, 2]
        scores = torch.einsum("hnd,htd->hnt", q[b, :heads, qp], k[b, :heads]) * scaling  # (h, n, T)
        future = torch.arange(k.shape[2], device=k.device).unsqueeze(0) > qp.unsqueeze(1)  # (n, T): causal
        scores = scores.masked_fill(future.unsqueeze(0), float("-inf"))
        logp = scores.log_softmax(-1)
        idx = kp.view(1, -1, 1).expand(scores.shape[0], -1, 1)
        losses.append(-logp.gather(-1, idx).squeeze(-1).reshape(-1))
        with torch.no_grad():
            hits += int((scores.argmax(-1) == kp.unsqueeze(0)).sum())
            n += scores.shape[0] * scores.shape[1]
    return torch.cat(losses).mean(), hits / max(n, 1)


def copy_readout_loss(model: Any, layer: int, v: Any, pairs: Any, ids: Any, head: int = 0) -> tuple[Any, float]:
    """Mean CE of what head ``head`` of decoder ``layer`` writes when it attends a pair's key, read out alone
    (its value there through the head's slice of ``o_proj``, the final norm and ``lm_head``), against the token
    the pair's query predicts (the copied token). Attention supervision teaches the head *where* to look; this
    teaches its value-output path to carry *what* is there into the answer. Returns (loss, top-1 share)."""
    import torch.nn.functional as F

    attn = decoder_layers(model)[layer].self_attn
    d = v.shape[-1]
    w_o = attn.o_proj.weight[:, head * d:(head + 1) * d]  # (hidden, d)
    vals = v[pairs[:, 0], head, pairs[:, 2]]  # (N, d)
    logits = model.lm_head(text_decoder(model).norm(vals @ w_o.T))
    target = ids[pairs[:, 0], pairs[:, 1] + 1]
    acc = float((logits.argmax(-1) == target).float().mean()) if len(target) else 0.0
    return F.cross_entropy(logits, target), acc


def loss_fn(model: Any, ids, w, extra: dict[str, Any], attn: dict[str, Any] | None = None):
    """Weighted next-token CE over positions with weight > 0; returns (loss, answer stats).

    ``ids``, ``w``: (B, T); ``extra``: the model's image inputs and ``attn_pairs`` (N, 3) from :func:`collate`.
    ``attn``: attention supervision, ``{"capture": dict from enable_attention_capture, "weight": float,
    "heads": int}``; adds ``weight`` × :func:`attention_loss` over ``extra["attn_pairs"]``, and with
    ``"readout"`` > 0 and ``"layer"``, ``readout`` × :func:`copy_readout_loss`."""
    import torch
    import torch.nn.functional as F

    dev = model.device
    ids, w = ids.to(dev), w.to(dev)
    extra = {k: v.to(dev) for k, v in extra.items()}
    pairs = extra.pop("attn_pairs", None)
    # Right padding needs no attention mask under causal attention: no real token attends a pad.
    hidden = model.model(input_ids=ids, use_cache=False, **extra).last_hidden_state  # (B, T, H)
    tw = w[:, 1:]  # weight of predicting token t+1 from position t
    sel = tw > 0
    logits = model.lm_head(hidden[:, :-1][sel])  # (N, V)
    target = ids[:, 1:][sel]
    ce = F.cross_entropy(logits, target, reduction="none")
    ww = tw[sel]
    loss = (ce * ww).sum() / ww.sum().clamp_min(1e-6)
    with torch.no_grad():
        ans = ww >= 1.0
        stats = {
            "answer_loss": float(ce[ans].mean()) if ans.any() else float("nan"),
            "answer_acc": float((logits[ans].argmax(-1) == target[ans]).float().mean()) if ans.any() else 0.0,
            "answer_tokens": int(ans.sum()),
            "weighted_tokens": int(sel.sum()),
        }
    if attn is not None and pairs is not None and len(pairs):
        cap = attn["capture"]
        head_dim = cap["q"].shape[-1]
        a_loss, a_acc = attention_loss(cap["q"], cap["k"], pairs, attn["heads"], head_dim ** -0.5)
        loss = loss + attn["weight"] * a_loss
        stats.update({"attn_loss": a_loss.item(), "attn_acc": a_acc, "attn_pairs": int(len(pairs))})
        if attn.get("readout", 0) > 0:
            r_loss, r_acc = copy_readout_loss(model, attn["layer"], cap["v"], pairs, ids)
            loss = loss + attn["readout"] * r_loss
            stats.update({"readout_loss": r_loss.item(), "readout_acc": r_acc})
    return loss, stats
