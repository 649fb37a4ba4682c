"""Objectives: pure losses (divergences, losses) and small objective classes."""
from lit_ascent.objectives.base import LossOutput, NoUpdate, Objective
from lit_ascent.objectives.distillation import Distillation

__all__ = ["Distillation", "LossOutput", "NoUpdate", "Objective"]
