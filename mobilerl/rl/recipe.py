"""The two AdaGRPO recipes (``rl.recipe``): the paper's text and the authors' released verl configuration, as values
of one typed set of switches (``rl.algo``, :class:`Algo`); a key of ``rl.algo`` changes one switch of the recipe.

Where they differ (docs/rl.md, "Recipes"): GRPO statistics per trajectory or per step row, re-normalised per data
source or not; negative pruning counting trajectories or rows; a symmetric clip or a wide asymmetric one with a
dual clip; no entropy bonus or 0.001; truncated IS off or always (C = 2); AdaPR's replay drawn before or after the
round's push and its eviction by advantage or by advantage and recency; FCF's failure count and weights; SPA's α.
Both replay an AdaPR entry in N = 1/κ rounds (Appendix B) and clamp the KL estimate (k3 ≤ 10).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Recipe = Literal["paper", "authors"]


class Algo(BaseModel):
    """``rl.algo``: the objective's and the mechanisms' switches (every one set by ``rl.recipe``)."""

    model_config = ConfigDict(extra="forbid")
    adv_stats: Literal["trajectory", "step"] = Field(..., description=(
        "GRPO's group mean and std over trajectories, or over step rows (a trajectory weighs its steps)."))
    adv_per_source: bool = Field(..., description=(
        "Whiten the round's advantages again within each data source (world, lab) over its step rows."))
    prune_unit: Literal["trajectory", "row"] = Field(..., description=(
        "rl.prune_negatives counts negative trajectories per positive trajectory, or negative rows per positive row."))
    clip_low: float = Field(..., gt=0, lt=1, description="ε_low: the ratio is clipped below at 1 − ε_low.")
    clip_high: float = Field(..., gt=0, description="ε_high: the ratio is clipped above at 1 + ε_high.")
    dual_clip: float | None = Field(..., gt=1, description=(
        "Dual clip c: a negative-advantage token's loss is at most c·|A| (None: off)."))
    entropy_coef: float = Field(..., ge=0, description="Entropy bonus: the loss minus this times the token entropy.")
    tis_cap: float | None = Field(..., ge=1.0, description=(
        "Ratio against the trainer's own old logprobs, each token weighted by min(π_old/π_behaviour, cap) (None: off)."))
    adapr_push_first: bool = Field(..., description=(
        "AdaPR pushes the round's trajectories before drawing its replay (ages 0 … N−1), else after (ages 1 … N)."))
    adapr_recency: float = Field(..., ge=0, le=1, description=(
        "Past capacity, AdaPR keeps by (1 − this)·advantage + this·recency, both min-max normalised (0: advantage)."))
    fcf_rule: Literal["paper", "authors"] = Field(..., description=(
        "paper: f counts all-zero rounds, weight exp(−f) after rl.fcf_patience, removal after rl.fcf_cooldown more; "
        "authors: f counts failed step rows, weight exp(−f) from the first, 0 once f > 3."))
    spa_alpha: float = Field(..., ge=0, le=1, description="SPA α (Eq. 2): a success of T steps keeps 1 − α(T − T_min)/T.")


RECIPES: dict[str, dict[str, Any]] = {
    "paper": {"adv_stats": "trajectory", "adv_per_source": False, "prune_unit": "trajectory", "clip_low": 0.2,
              "clip_high": 0.2, "dual_clip": None, "entropy_coef": 0.0, "tis_cap": None, "adapr_push_first": False,
              "adapr_recency": 0.0, "fcf_rule": "paper", "spa_alpha": 1.0},
    "authors": {"adv_stats": "step", "adv_per_source": True, "prune_unit": "row", "clip_low": 0.5, "clip_high": 1.2,
                "dual_clip": 3.0, "entropy_coef": 0.001, "tis_cap": 2.0, "adapr_push_first": True,
                "adapr_recency": 0.5, "fcf_rule": "authors", "spa_alpha": 0.5},
}


def resolve(recipe: str, algo: dict[str, Any] | None) -> dict[str, Any]:
    """``rl.algo`` as given over the switches of ``recipe`` (the keys not given are the recipe's)."""
    if recipe not in RECIPES:
        raise ValueError(f"rl.recipe: {recipe!r} is not one of {sorted(RECIPES)}")
    return {**RECIPES[recipe], **(algo or {})}
