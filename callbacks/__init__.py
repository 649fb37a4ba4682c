"""Thin callbacks: gate, filter, experience log, adapter saving, diagnostics, report, transcripts, held-out evaluation."""
from callbacks.adapter_checkpoint import AdapterCheckpoint
from callbacks.base import EpisodeCallback, PeriodicEval
from callbacks.diagnostics import CollapseDiagnostics
from callbacks.experience_log import ExperienceLog
from callbacks.gate import InvalidTurnFilter, VerificationGate
from callbacks.heldout import HeldOutEval
from callbacks.probe import PIProbe
from callbacks.report import StreamReport
from callbacks.stream_stats import StreamStats
from callbacks.transcript import EpisodeTranscripts
from callbacks.transfer import TransferEval

__all__ = ["AdapterCheckpoint", "CollapseDiagnostics", "EpisodeCallback", "EpisodeTranscripts", "ExperienceLog",
           "HeldOutEval", "InvalidTurnFilter", "PIProbe", "PeriodicEval", "StreamReport", "StreamStats", "TransferEval",
           "VerificationGate"]
