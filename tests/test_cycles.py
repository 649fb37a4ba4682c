"""Iterated cycles: snapshot teacher, frozen within a cycle; debug configs end to end."""
import json
import random

import pytest
import torch
from test_resail import PI, make_episode
from torch.testing import assert_close

from lit_ascent.cycles import CyclesConfig, SnapshotTeacher, carried_record, distil, fixed_point, main, write_lesson
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


def test_teacher_side_is_computed_once_per_episode_and_the_steps_are_unchanged(policy, monkeypatch):
    """distil prepares each drawn episode once per cycle; the adapter ends where preparing every batch anew
    (``prepare_batch`` at each update, the same random batches) takes it."""
    eps = [make_episode(policy.tokenizer, k, 2 + k % 2) for k in range(4)]
    objective, data = ReSAIL(selection_ratio=0.5, trajectory_balance=True, retention_weight=0.5), [(e, PI) for e in eps]
    start = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}

    snap = SnapshotTeacher(policy)
    opt = torch.optim.AdamW(snap.trainable_parameters(), lr=1e-2)
    rng = random.Random(3)
    for _ in range(4):  # the reference: every update prepares its batch from scratch
        batch = rng.sample(data, 3)
        episodes = [e for e, _ in batch]
        out = objective.loss_batch(snap, episodes, objective.prepare_batch(snap, episodes, [z for _, z in batch]))
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    want = {n: p.detach().clone() for n, p in snap.model.named_parameters() if p.requires_grad}

    with torch.no_grad():  # back to the start, teacher included
        for n, p in snap.model.named_parameters():
            if n in start:
                p.copy_(start[n])
    snap.snapshot()
    prepared_calls = []
    real = ReSAIL.prepare_episode
    monkeypatch.setattr(ReSAIL, "prepare_episode", lambda self, *a: prepared_calls.append(a[1]) or real(self, *a))
    history = distil(snap, objective, data, updates=4, batch_size=3, opt=torch.optim.AdamW(
        snap.trainable_parameters(), lr=1e-2), grad_clip=1e9, rng=random.Random(3))
    assert len(history) == 4 and len(prepared_calls) == len({id(e) for e in prepared_calls}) <= 4
    for n, p in snap.model.named_parameters():
        if p.requires_grad:
            assert_close(p, want[n], rtol=0, atol=0)


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


DEBUG = ["--config", "configs/resail/debug_sdpo.yaml", "--config", "configs/resail/debug_sdpo_resail.yaml",
         "--num_tasks", "2", "--env.init_args.verify_every", "1"]


def without_timings(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def test_a_run_resumed_after_a_finished_cycle_gives_the_uninterrupted_rows(tmp_path, monkeypatch):
    whole = main([*DEBUG, "--log_dir", str(tmp_path / "whole")])
    import lit_ascent.cycles as cycles

    real, calls = cycles.distil, []

    def stop_in_cycle_1(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the machine went away while cycle 1 distilled
        return real(*args)

    monkeypatch.setattr(cycles, "distil", stop_in_cycle_1)
    with pytest.raises(KeyboardInterrupt):
        main([*DEBUG, "--log_dir", str(tmp_path / "cut")])
    monkeypatch.undo()
    resumed = main([*DEBUG, "--log_dir", str(tmp_path / "cut"), "--resume", "true"])
    assert without_timings(resumed) == without_timings(whole) and len(whole) == 3
    for name in ("cycles.jsonl", "tasks.jsonl"):
        rows = [json.loads(x) for x in (tmp_path / "cut" / name).read_text().splitlines()]
        assert without_timings(rows) == without_timings(
            [json.loads(x) for x in (tmp_path / "whole" / name).read_text().splitlines()])  # no row twice
    from safetensors.torch import load_file

    final = [load_file(tmp_path / run / "adapter" / "adapter_model.safetensors") for run in ("whole", "cut")]
    assert final[0].keys() == final[1].keys() and all(torch.equal(final[0][k], final[1][k]) for k in final[0])


def test_a_deployment_that_verifies_nothing_is_carried_as_the_rows_a_replay_gives(tmp_path, monkeypatch):
    """No verified episode: no update, so later cycles are not played again; their rows (and task rows) are the
    ones a replay of every cycle gives, marked ``carried_from``."""
    import lit_ascent.cycles as cycles
    from lit_ascent.envs import ScriptedEnv

    monkeypatch.setattr(ScriptedEnv, "verify_at_end", lambda self: False)
    real, played = cycles.evaluate, []
    monkeypatch.setattr(cycles, "evaluate", lambda *a, **k: played.append(1) or real(*a, **k))
    carried = main([*DEBUG, "--log_dir", str(tmp_path / "carried")])
    assert len(played) == 1 and [r.get("carried_from") for r in carried] == [None, 0, 0]
    monkeypatch.setattr(cycles, "fixed_point", lambda records: None)  # the reference: play every cycle
    replayed = main([*DEBUG, "--log_dir", str(tmp_path / "replayed")])
    assert len(played) == 4 and replayed[0]["deployed/verified"] == 0
    assert [{k: v for k, v in r.items() if k != "carried_from"} for r in without_timings(carried)] == \
        without_timings(replayed)
    tasks = [(tmp_path / run / "tasks.jsonl").read_text() for run in ("carried", "replayed")]
    assert tasks[0] == tasks[1] and tasks[0].count('"cycle": 2') == 2


def test_a_carried_row_points_at_the_played_one():
    row = {"cycle": 1, "deployed/verified": 0, "perf/collect_s": 9.0, "perf/diagnostics_s": 2.0}
    assert fixed_point([row]) == 1 and fixed_point([{**row, "deployed/verified": 1}]) is None
    assert fixed_point([]) is None
    again = carried_record(2, row)
    assert again == {"cycle": 2, "deployed/verified": 0, "perf/collect_s": 0.0, "perf/diagnostics_s": 0.0,
                     "carried_from": 1}
    assert carried_record(3, again)["carried_from"] == 1 and fixed_point([row, again]) == 1


def test_resume_with_another_setting_fails_naming_it(tmp_path):
    main([*DEBUG, "--log_dir", str(tmp_path), "--cycles.cycles", "1"])
    with pytest.raises(ValueError, match="resume: the config differs"):
        main([*DEBUG, "--log_dir", str(tmp_path), "--cycles.cycles", "1", "--optim.lr", "0.5", "--resume", "true"])
    rows = main([*DEBUG, "--log_dir", str(tmp_path), "--cycles.cycles", "1", "--resume", "true"])
    assert len(rows) == 2  # nothing left to run: the finished rows come back


def test_each_cycle_logs_its_task_outcomes_and_collapse_diagnostics(tmp_path):
    rows = main([*DEBUG, "--log_dir", str(tmp_path)])
    tasks = [json.loads(x) for x in (tmp_path / "tasks.jsonl").read_text().splitlines()]
    for r in rows:
        deployed = [t for t in tasks if t["cycle"] == r["cycle"] and t["kind"] == "deployed"]
        probed = [t for t in tasks if t["cycle"] == r["cycle"] and t["kind"] == "probe"]
        assert len(deployed) == 2 and len(probed) == r["probe/size"] == 2
        assert r["deployed/verified"] == sum(t["verified"] for t in deployed)
        assert r["probe/pi_success"] == sum(t["verified"] for t in probed) / 2
        assert r["diagnostics/first_token_entropy"] > 0 and "diagnostics/repeat_action_rate" in r
        assert "diagnostics/action_kl" in r  # the random model's episodes hold no action: no probe, 0
        assert r["perf/collect_s"] > 0 and r["perf/diagnostics_s"] > 0
    assert abs(rows[0]["diagnostics/drift_kl"]) < 1e-6 < rows[1]["diagnostics/drift_kl"]  # moved in cycle 0


def test_deployment_diagnostics_are_the_means_over_the_episodes_and_the_probes_drift(policy):
    from conftest import hand_episode

    from lit_ascent.collapse import deployment_diagnostics, first_probes, first_token, probe_drift
    from lit_ascent.metrics import repeated_actions

    snap = SnapshotTeacher(policy)
    episodes = [hand_episode(policy.tokenizer, ["Action: go north", "Action: go north"], first="Goal: a"),
                hand_episode(policy.tokenizer, ["Action: take key", "Action: go east"], first="Goal: bb")]
    probes = first_probes(policy.tokenizer, episodes, 1)
    assert len(probes) == 1 and torch.equal(probes[0]["ids"][:10], episodes[0].ids()[:10])
    with torch.no_grad():
        for name, p in snap.model.named_parameters():
            if "lora_B" in name and ".default." in name:
                p.add_(0.1)
    got = deployment_diagnostics(snap, episodes, probes, snap.initial)
    each = [first_token(snap, e, snap.initial) | repeated_actions(e.actions) for e in episodes]
    for key in ("diagnostics/first_token_entropy", "diagnostics/drift_kl", "diagnostics/repeat_action_rate"):
        assert got[key] == pytest.approx((each[0][key] + each[1][key]) / 2)
    assert got["diagnostics/repeat_action_rate"] == pytest.approx(0.25) and got["diagnostics/drift_kl"] > 0
    assert got["diagnostics/action_kl"] == probe_drift(snap, probes, snap.initial)["diagnostics/action_kl"] > 0
    with snap.initial():  # the initial model is every adapter off, not the cycle's teacher
        base = snap.logits(episodes[0].ids())
    with torch.no_grad(), snap.model.disable_adapter():
        assert torch.equal(snap.logits(episodes[0].ids()), base)


def test_the_fused_engine_gives_the_cycles_of_the_reference_decoder(tmp_path):
    """Deployment and probes through the fused CPU decoder (the reference configs' engine), batched: the
    same rows as transformers' forward one episode at a time (float32), though the student changes each cycle."""
    hf = main([*DEBUG, "--log_dir", str(tmp_path / "hf")])
    fused = main([*DEBUG, "--log_dir", str(tmp_path / "fused"), "--rollout.engine", "fused",
                  "--cycles.eval_batch_size", "2"])
    assert without_timings(fused) == without_timings(hf)
    assert [t for t in (tmp_path / "fused" / "tasks.jsonl").read_text().splitlines()] == \
        [t for t in (tmp_path / "hf" / "tasks.jsonl").read_text().splitlines()]
