"""Objectives: pure losses (divergences, losses) and small objective classes."""
from lit_ascent.objectives.base import LossOutput, NoUpdate, Objective
from lit_ascent.objectives.baselines import TTOPSD, Imitation, Reinforce, ReinforcePP
from lit_ascent.objectives.distillation import Distillation
from lit_ascent.objectives.resail import ReSAIL

__all__ = ["Distillation", "Imitation", "LossOutput", "NoUpdate", "Objective", "ReSAIL", "Reinforce",
           "ReinforcePP", "TTOPSD"]
