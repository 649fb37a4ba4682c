"""Text environments: the protocol, a scripted test env and real adapters.

What a new environment needs is importable from here: subclass ``TextEnv``, list ``Task``s,
return ``StepResult``s (``parse_action`` reads the action a turn wrote; ``ScriptedEnv`` is the
smallest complete example). Real adapters import their packages lazily:
``lit_ascent.envs.textcraft.TextCraftEnv``, ``lit_ascent.envs.alfworld.ALFWorldEnv``.
"""
from lit_ascent.envs.base import IncompleteEnvError, ScriptedEnv, StepResult, TextEnv, parse_action
from lit_ascent.envs.guarded import EnvContractError, EnvFault, GuardedEnv
from lit_ascent.trajectory import Task

__all__ = ["EnvContractError", "EnvFault", "GuardedEnv", "IncompleteEnvError", "ScriptedEnv", "StepResult", "Task",
           "TextEnv", "parse_action"]
