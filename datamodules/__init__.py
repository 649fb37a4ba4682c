"""Data modules: the one-pass task stream."""
from datamodules.stream import TaskStreamDataModule, stream_order

__all__ = ["TaskStreamDataModule", "stream_order"]
