"""Data modules: the one-pass task stream."""
from datamodules.stream import TaskStreamDataModule

__all__ = ["TaskStreamDataModule"]
