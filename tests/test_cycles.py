"""Iterated cycles: snapshot teacher, frozen within a cycle; debug configs end to end."""
import json
import random

import pytest
import torch
from test_resail import PI, make_episode
from torch.testing import assert_close

from lit_ascent.cycles import CyclesConfig, SnapshotTeacher, distil, main, write_lesson
from lit_ascent.objectives import ReSAIL
from lit_ascent.privileged import LESSON_HEADER



def test_cycle0_teacher_is_the_base_model(policy):
    ids = make_episode(policy.tokenizer, 0, 1).ids()
    with policy.teacher():
        base = policy.logits(ids)
    snap = SnapshotTeacher(policy)
    with snap.teacher():
        assert_close(snap.logits(ids), base)
    assert all(".default." in n for n, p in snap.model.named_parameters() if p.requires_grad)


def test_teacher_outputs_do_not_move_while_the_student_trains(policy):
    snap = SnapshotTeacher(policy)
    eps = [make_episode(policy.tokenizer, k, 2) for k in range(3)]
    ids = eps[0].ids()
    with torch.no_grad():
        student_before = snap.logits(ids)
    with snap.teacher():
        teacher_before = snap.logits(ids)
    opt = torch.optim.AdamW(snap.trainable_parameters(), lr=1e-2)
    history = distil(snap, ReSAIL(selection_ratio=0.5), [(e, PI) for e in eps], updates=3, batch_size=2,
                     opt=opt, grad_clip=1.0, rng=random.Random(0))
    assert len(history) == 3
    with snap.teacher():
        assert_close(snap.logits(ids), teacher_before)  # frozen for the whole cycle
    with torch.no_grad():
        student_after = snap.logits(ids)
    assert not torch.allclose(student_after, student_before, rtol=0, atol=1e-6)
    snap.snapshot()  # next cycle: the teacher is the student as it is now
    with snap.teacher():
        assert_close(snap.logits(ids), student_after)
    assert all(".default." in n for n, p in snap.model.named_parameters() if p.requires_grad)


def test_lesson_is_greedy_and_marked(policy):
    snap = SnapshotTeacher(policy)
    ep = make_episode(policy.tokenizer, 1, 2)
    first, second = write_lesson(snap, ep, 6), write_lesson(snap, ep, 6)
    assert first == second and first.startswith(LESSON_HEADER)


@pytest.mark.parametrize("kwargs, name", [({"cycles": 0}, "cycles"), ({"batch_size": 0}, "batch_size"),
                                          ({"pi_source": "raw"}, "pi_source"), ({"probe_size": -1}, "probe_size")])
def test_bad_schedule_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        CyclesConfig(**kwargs)


@pytest.mark.parametrize("variant, extra", [("sdpo", []), ("sdpo_resail", []), ("oel", []),
                                            ("oel_resail", ["--cycles.eval_batch_size", "2"])])
def test_debug_config_runs_two_cycles(tmp_path, variant, extra):
    overlay = [] if variant == "sdpo" else ["--config", f"configs/resail/debug_{variant}.yaml"]
    records = main(["--config", "configs/resail/debug_sdpo.yaml", *overlay, "--log_dir", str(tmp_path),
                    "--num_tasks", "2", "--env.init_args.verify_every", "1", *extra])
    rows = [json.loads(line) for line in (tmp_path / "cycles.jsonl").read_text().splitlines()]
    assert [r["cycle"] for r in rows] == [0, 1, 2] == [r["cycle"] for r in records]
    assert [r.get("updates") for r in rows] == [2, 2, None]  # the last row only deploys and probes
    for r in rows:
        assert r["deployed/success_rate"] == 1.0 and r["probe/size"] == 2
        assert 0.0 <= r["probe/pi_success"] <= 1.0
    assert "loss/selective" in rows[0] and ("loss/retention" in rows[0]) == variant.endswith("resail")
    assert list(tmp_path.glob("events.out.tfevents.*"))
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
