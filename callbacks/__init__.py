"""Thin callbacks: gate, filter, experience log, adapter saving, diagnostics, report."""
from callbacks.adapter_checkpoint import AdapterCheckpoint
from callbacks.diagnostics import CollapseDiagnostics
from callbacks.experience_log import ExperienceLog
from callbacks.gate import EpisodeCallback, InvalidTurnFilter, VerificationGate
from callbacks.report import StreamReport, summarize

__all__ = ["AdapterCheckpoint", "CollapseDiagnostics", "EpisodeCallback", "ExperienceLog",
           "InvalidTurnFilter", "StreamReport", "VerificationGate", "summarize"]
