"""Task suites of the simulator: ``world`` (AndroidWorld-like) and ``lab`` (AndroidLab-like)."""

from mobilerl.env.sim.tasks.base import Expert, ExpertError, OracleAgent, Template, answer_matches
from mobilerl.env.sim.tasks.registry import get_task, list_tasks, optimal_steps, template, templates

__all__ = [
    "Expert", "ExpertError", "OracleAgent", "Template", "answer_matches",
    "get_task", "list_tasks", "optimal_steps", "template", "templates",
]
