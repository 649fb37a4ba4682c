"""The programs' command lines (``lit_ascent.options``): argparse forms over a typed dataclass, jsonargparse checks."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from lit_ascent.options import attribute_docs, options_parser, parse_options


@dataclass
class Demo:
    """A demo program."""

    root: Path = field(metadata={"positional": True})
    """Folder read."""
    out: str
    """Output file."""
    num_tasks: int | None = None
    """Stream length
    (None: all)."""
    seeds: list[int] = field(default_factory=lambda: [0])
    """Seeds, space-separated."""
    labels: list[str] = field(default_factory=lambda: ["a", "b"], metadata={"nargs": 2})
    """Two column names."""
    extra: list[Path] = field(default_factory=list, metadata={"nargs": "*", "action": "extend"})
    """Overlays, repeatable."""
    quick: bool = False
    """Smaller sizes."""
    dtype: Literal["float32", "bfloat16"] = field(default="float32", metadata={"group": "Model"})
    """Model dtype."""
    max_demo_tokens: int | None = field(default=None, metadata={"aliases": ["--max-demos-tokens"]})
    """Longest demo."""

    def __post_init__(self) -> None:
        if self.num_tasks is not None and self.num_tasks < 1:
            raise ValueError(f"--num-tasks must be >= 1, got {self.num_tasks}")


def test_defaults_and_the_argparse_forms():
    assert parse_options(Demo, ["r", "--out", "o"]) == Demo(root=Path("r"), out="o")
    got = parse_options(Demo, ["r", "--out", "o", "--num-tasks", "3", "--seeds", "0", "1", "2", "--labels", "x", "y",
                               "--extra", "a", "b", "--extra", "c", "--quick", "--dtype", "bfloat16",
                               "--max-demos-tokens", "900"])
    assert got == Demo(root=Path("r"), out="o", num_tasks=3, seeds=[0, 1, 2], labels=["x", "y"],
                       extra=[Path("a"), Path("b"), Path("c")], quick=True, dtype="bfloat16", max_demo_tokens=900)


@pytest.mark.parametrize("argv, named", [
    (["r"], "--out"),                                          # required
    (["r", "--out", "o", "--num-tasks", "0"], "--num-tasks"),  # __post_init__
    (["r", "--out", "o", "--num-tasks", "x"], "num_tasks"),    # type
    (["r", "--out", "o", "--dtype", "fp8"], "dtype"),          # Literal
    (["r", "--out", "o", "--labels", "x"], "--labels"),        # nargs
])
def test_bad_values_exit_2_naming_the_option(argv, named, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_options(Demo, argv)
    assert exit_.value.code == 2 and named in capsys.readouterr().err


def test_help_shows_the_attribute_docstrings_and_groups():
    text = options_parser(Demo, prog="demo").format_help()
    for doc in ("A demo program.", "Folder read.", "Stream length (None: all).", "Two column names.", "Model:"):
        assert doc in text
    assert attribute_docs(Demo)["num_tasks"] == "Stream length (None: all)."


DOCUMENTED = [  # (module, options class, a command line of the module docstrings / README)
    ("lit_ascent.results.compare", "CompareOptions",
     "--env-config configs/textcraft/ascent.yaml --methods base ascent rft --seeds 0 1 2 --num-tasks 20 "
     "--out runs/compare --extra-config configs/smoke.yaml --fixed-stream --dry-run"),
    ("lit_ascent.results.report", "ReportOptions", "runs/compare --out docs/results/x --common-prefix"),
    ("lit_ascent.warmstart.planner_cache", "PlannerCacheOptions", "--split valid_train --out demos.jsonl --limit 2"),
    ("lit_ascent.bench.throughput", "ThroughputBenchOptions", "--quick --out docs/results/bench --threads 1 --dtype auto"),
    ("lit_ascent.bench.memory", "MemoryBenchOptions", "disabled_ckpt --dtype auto --length 1024"),
    ("lit_ascent.bench.engines", "EnginesBenchOptions", "--out /tmp/e --engines hf fused --stream-tasks 10"),
    ("lit_ascent.bench.ray_streams", "RayStreamsOptions", "--quick --out /tmp/bench_ray"),
    ("lit_ascent.bench.replay", "ReplayBenchOptions", "--dtype auto --reps 3 --out docs/results/bench_replay"),
    ("lit_ascent.bench.cuda", "CudaBenchOptions", "--out /tmp/c --device cpu --tokens 8"),
]


@pytest.mark.parametrize("module, name, line", DOCUMENTED)
def test_documented_commands_parse(module, name, line):
    import importlib
    import shlex

    cls = getattr(importlib.import_module(module), name)
    options = parse_options(cls, shlex.split(line))
    assert isinstance(options, cls)


def test_replay_keeps_its_own_options_and_hands_the_rest_to_train_py():
    from lit_ascent.replay import ReplayOptions, split_argv

    own, rest = split_argv(["--config", "c.yaml", "--task", "3", "--data.seed", "1", "--actions", "go", "a bad move",
                            "--model.llm.dtype=float32", "--solver"])
    assert own == ["--task", "3", "--actions", "go", "a bad move", "--solver"]
    assert rest == ["--config", "c.yaml", "--data.seed", "1", "--model.llm.dtype=float32"]
    with pytest.raises(ValueError, match="exactly one of --task and --task-id"):
        ReplayOptions(task=1, task_id="t", solver=True)
    with pytest.raises(ValueError, match="exactly one of --actions and --solver"):
        ReplayOptions(task=1, actions=["go"], solver=True)
