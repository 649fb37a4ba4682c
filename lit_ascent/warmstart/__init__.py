"""The warm-start recipe (issue 5): verified demonstrations of three kinds (plain,
recovery, hindsight), behaviour cloning into a LoRA adapter, and the reference
evaluation (plain / hindsight / control).

    python -m lit_ascent.warmstart --env textcraft --out adapters/textcraft-ref
    python -m lit_ascent.warmstart eval --adapter adapters/textcraft-ref --num-tasks 30 --hindsight --control
"""
from lit_ascent.warmstart.demos import (
           DEMO_KINDS,
           Demo,
           DemoStats,
           Script,
           build_demos,
           check_replay,
           privileged_block,
)
from lit_ascent.warmstart.train import (
           bc_loss,
           demo_targets,
           mean_bc_loss,
           save_adapter,
           train_adapter,
)

__all__ = ["DEMO_KINDS", "Demo", "DemoStats", "Script", "bc_loss", "build_demos", "check_replay", "demo_targets",
           "mean_bc_loss", "privileged_block", "save_adapter", "train_adapter"]
