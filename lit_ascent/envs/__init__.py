"""Text environments: the protocol, a scripted test env and real adapters.

Real adapters import their packages lazily: ``lit_ascent.envs.textcraft.TextCraftEnv``,
``lit_ascent.envs.alfworld.ALFWorldEnv``.
"""
from lit_ascent.envs.base import ScriptedEnv, StepResult, TextEnv, parse_action

__all__ = ["ScriptedEnv", "StepResult", "TextEnv", "parse_action"]
