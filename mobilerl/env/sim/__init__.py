"""The embedded Android simulator: a deterministic, seedable device with real uiautomator XML."""

from mobilerl.env.sim.device import App, Device, Perturb
from mobilerl.env.sim.env import SimEnv, hidden_ground_truth, run_oracle

__all__ = ["App", "Device", "Perturb", "SimEnv", "hidden_ground_truth", "run_oracle"]
