"""Policies and the one multi-turn rollout loop."""

from mobilerl.agent.policy import (
    NoisyPolicy,
    OraclePolicy,
    Policy,
    PolicyContext,
    PolicyError,
    PolicyOutput,
    RandomPolicy,
    ScriptedPolicy,
    parse_compressed,
)
from mobilerl.agent.rollout import rollout

__all__ = [
    "NoisyPolicy",
    "OraclePolicy",
    "Policy",
    "PolicyContext",
    "PolicyError",
    "PolicyOutput",
    "RandomPolicy",
    "ScriptedPolicy",
    "parse_compressed",
    "rollout",
]
