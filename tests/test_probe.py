"""PIProbe: success with vs without the privileged information, adapter untouched."""
import json

import pytest
from test_transfer import stream_trainer
from torch.testing import assert_close

from callbacks import PIProbe, VerificationGate
from lit_ascent.envs import ScriptedEnv
from lit_ascent.objectives import NoUpdate



def test_probe_logs_both_rates_and_leaves_the_adapter_unchanged(tmp_path):
    probe = PIProbe(every_n_tasks=2, num_tasks=2)
    captured = {}

    class Spy(VerificationGate):  # record the adapter when the stream starts
        def on_train_start(self, trainer, pl_module):
            captured["start"] = pl_module.policy.adapter_state()

    trainer, module, logger = stream_trainer(tmp_path, [Spy(), probe], NoUpdate(), num_tasks=4)
    assert [s for s, _ in logger.logged("probe/pi_success")] == [2, 4]
    assert [s for s, _ in logger.logged("probe/plain_success")] == [2, 4]
    assert all(0.0 <= v <= 1.0 for _, v in logger.logged("probe/pi_success"))
    assert len(probe.probe) == 2 and probe.probe[0][1].startswith("Hindsight")
    assert probe.env is not trainer.datamodule.env  # its own instance
    # no objective updates here, so any change of the adapter would be the probe's
    for name, value in module.policy.adapter_state().items():
        assert_close(value, captured["start"][name])


def test_probe_reads_demonstrations(tmp_path):
    path = tmp_path / "demos.jsonl"
    records = [{"task_id": "task-0", "actions": ["look", "do 0"]},
               {"game": "task-1", "actions": ["do 1"], "won": False},  # failed demos are skipped
               {"game": "task-2", "actions": ["look", "do 2"], "won": True},
               {"task_id": "task-3", "actions": ["do 3"]}]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    probe = PIProbe(every_n_tasks=0, num_tasks=2, demonstrations=str(path), env=ScriptedEnv())
    probe.setup(None, None, "fit")
    assert [t.task_id for t, _ in probe.probe] == ["task-0", "task-2"]
    assert "Action: do 2" in probe.probe[1][1]


def test_bad_arguments_name_themselves(tmp_path):
    with pytest.raises(ValueError, match="num_tasks"):
        PIProbe(num_tasks=0)
    with pytest.raises(ValueError, match="demonstrations"):
        PIProbe(demonstrations=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="pi_content"):
        PIProbe(pi_content="everything")
