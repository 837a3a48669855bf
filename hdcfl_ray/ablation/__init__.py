"""Replaying a finished run's server-side decisions with other settings, without retraining."""

from hdcfl_ray.ablation.replay import ablate_run

__all__ = ["ablate_run"]
