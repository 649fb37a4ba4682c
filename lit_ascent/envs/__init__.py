"""Text environments: the protocol, a scripted test env and real adapters."""
from lit_ascent.envs.base import ScriptedEnv, StepResult, TextEnv, parse_action

__all__ = ["ScriptedEnv", "StepResult", "TextEnv", "parse_action"]
