"""The report's in-context memory table and its method-vs-method pairs (e.g. ASCENT + memory vs the memory alone),
against hand-made records."""
from __future__ import annotations

import json

import pytest
from conftest import hand_episode
from test_heldout import records
from test_report import records_of

from lit_ascent.memory import SOLVED_ACTIONS_SHOWN, rule_lessons
from lit_ascent.results import memory_stats, paired, report, run_archive
from lit_ascent.tiny import byte_tokenizer

TOK = byte_tokenizer()


def with_memory(stream, memory) -> list[dict]:
    """``records_of(stream)`` with the ``memory/*`` keys of each task: (tokens, shown, cut, size)."""
    return [r | dict(zip((memory_stats.TOKENS, memory_stats.SHOWN, memory_stats.CUT, memory_stats.SIZE),
                         map(float, m)))
            for r, m in zip(records_of(stream), memory)]


def test_memory_stats_against_hand_made_records():
    stream = [("t0", 1, 3, 0), ("t1", 1, 4, 0), ("t2", 0, 5, 2), ("t3", 1, 3, 0)]
    memory = [(0, 0, 0, 1), (300, 1, 0, 2), (900, 2, 1, 2), (600, 2, 0, 3)]
    stats = memory_stats.memory_stats(with_memory(stream, memory))
    assert stats["tokens_mean"] == pytest.approx((0 + 300 + 900 + 600) / 4) and stats["tokens_max"] == 900
    assert stats["shown_share"] == pytest.approx(3 / 4) and stats["entries_mean"] == pytest.approx(5 / 3)
    assert (stats["cut"], stats["tasks_cut"], stats["size_end"]) == (1, 1, 3)
    assert stats["success_shown"] == pytest.approx(2 / 3) and stats["success_not_shown"] == 1.0
    assert stats["copied_share"] is None  # no block quotes an action
    assert not memory_stats.has_memory(with_memory(stream, [(0, 0, 0, 0)] * 4))  # NoMemory logs zeros
    assert not memory_stats.has_memory(records_of(stream))  # runs from before the memory


def test_copied_share_counts_the_actions_quoted_by_the_block_shown():
    block = "Memory: ...\nTask: Goal: craft golden boots.\nStep 1:\nThought: get them.\nAction: get 4 gold ingot\n" \
            "Step 2:\nAction: craft 1 golden boots using 4 gold ingot"
    assert memory_stats.quoted_actions(block) == {"get 4 gold ingot", "craft 1 golden boots using 4 gold ingot"}
    records = [{"memory_text": block, "actions": ["get 4 gold ingot", "get 1 oak logs", "get 4 gold ingot"]},
               {"memory_text": None, "actions": ["get 4 gold ingot"]},  # no block: not counted
               {"memory_text": "Playbook: lessons", "actions": ["get 2 stick"]}]  # quotes no action: not counted
    assert memory_stats.copied_share(records) == pytest.approx(2 / 3)
    assert memory_stats.copied_share(records[1:]) is None


def test_the_playbook_block_is_read_back_as_the_rule_writer_wrote_it():
    texts = ["Action: get 1 iron", "Action: get 2 oak logs", "Action: craft 4 oak planks using 1 oak logs"]
    episode = hand_episode(TOK, texts, valid=[False, True, True], observation=lambda t: f"Could not find {t}.",
                           verified=True)
    block = "Playbook: lessons\n" + "\n".join(f"- {x}" for x in rule_lessons(episode, "Goal: craft oak planks."))
    assert memory_stats.rejected_actions(block) == {"get 1 iron"}
    assert memory_stats.quoted_actions(block) == {"get 2 oak logs", "craft 4 oak planks using 1 oak logs"}
    records = [{"memory_text": block, "actions": ["get 1 iron", "get 2 oak logs", "get 1 iron", "look"]}]
    assert memory_stats.warned_share(records) == pytest.approx(2 / 4)
    assert memory_stats.copied_share(records) == pytest.approx(1 / 4)
    longer = [f"Action: get {i} stick" for i in range(SOLVED_ACTIONS_SHOWN + 2)]  # the list ends in " ..."
    cut = "\n".join(f"- {x}" for x in rule_lessons(hand_episode(TOK, longer, verified=True), "Goal: g"))
    assert memory_stats.quoted_actions(cut) == {f"get {i} stick" for i in range(SOLVED_ACTIONS_SHOWN)}
    assert memory_stats.rejected_actions(cut) == set()


def write_runs(root, streams, heldout=None, memory=None):
    for method, seeds in streams.items():
        for seed, stream in seeds.items():
            run = root / method / seed
            run.mkdir(parents=True)
            rows = with_memory(stream, memory[method]) if memory and method in memory else records_of(stream)
            (run / "experience.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            if heldout and method in heldout:
                lines = records(heldout[method][seed], tasks_seen=len(stream))
                (run / run_archive.HELDOUT_NAME).write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_report_pairs_two_methods_on_the_stream_and_the_held_out_set(tmp_path):
    root, out = tmp_path / "compare", tmp_path / "out"
    tasks = ["t0", "t1", "t2", "t3"]
    outcomes = {"base": "1000", "memory": "1100", "both": "1011"}  # both vs memory: both t0, only both t2 t3, only memory t1
    streams = {m: {"seed0": [(t, int(v), 3, 0) for t, v in zip(tasks, o)]} for m, o in outcomes.items()}
    heldout = {"base": {"seed0": "100000"}, "memory": {"seed0": "110000"}, "both": {"seed0": "101110"}}
    memory = {m: [(0, 0, 0, 0), (200, 1, 0, 1), (400, 2, 0, 2), (400, 2, 1, 3)] for m in ("memory", "both")}
    write_runs(root, streams, heldout, memory)
    table = report.write_report(root, out, pairs=["both:memory"])["table"].read_text()
    section = table[table.index("`both` paired with `memory` on the stream"):]
    online, held = section.split("Their end-of-stream held-out agents")
    p_online = paired.mcnemar_exact_p(2, 1)
    assert f"| both | seed0 | 1 | 2 | 1 | 0 | {p_online:.3g} |" in online
    # held-out: both h0, only both h2 h3 h4, only memory h1, neither h5
    assert f"| both | seed0 | 1 | 3 | 1 | 1 | {paired.mcnemar_exact_p(3, 1):.3g} |" in held
    memory_table = table[table.index("In-context memory per run"):]
    assert "| memory | seed0 | 4 | 250 / 400 | 75% | 1.67 | 1 / 1 | 3 | - | - | 33% / 100% |" in memory_table
    assert "| base |" not in memory_table


@pytest.mark.parametrize("pair", ["both", "both:", "both:nope", ":memory"])
def test_report_rejects_a_malformed_or_unknown_pair(tmp_path, pair):
    root = tmp_path / "compare"
    write_runs(root, {m: {"seed0": [("t0", 1, 3, 0)]} for m in ("base", "memory", "both")})
    with pytest.raises(ValueError, match="METHOD:REFERENCE"):
        report.write_report(root, tmp_path / "out", pairs=[pair])
