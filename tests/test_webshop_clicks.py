"""lit_ascent.results.webshop_clicks: the opened result's rank, per run and per gained or lost goal."""
import gzip
import json

import pytest

from lit_ascent.results.webshop_clicks import gains_by_top_hit, main, opened_rank, run_row

HITS = {"red shoes": ["A1", "B2", "C3"], "blue shoes": ["C3", "A1"]}


def search(query):
    return HITS.get(query, [])


def record(task, actions, verified):
    return {"task_id": f"{task}#0", "task_index": 0, "actions": actions, "verified": verified, "model": "adapted",
            "tasks_seen": 2}


@pytest.mark.parametrize("actions,expected", [
    (["search[red shoes]", "click[B2]", "click[buy now]"], (2, 2)),
    (["search[red shoes]", "click[b2]"], (2, 2)),  # ids compare case-insensitively
    (["search[red shoes]", "click[Z9]", "click[A1]"], (1, 2)),  # a refused id opens nothing
    (["search[red shoes]", "click[back to search]", "search[blue shoes]", "click[C3]"], (1, None)),  # the latest search; B2 not in it
    (["click[B2]", "think about it", "search[]"], (None, None)),  # no search, then an empty one
    (["search[nothing]", "click[A1]"], (None, None)),
])
def test_opened_rank(actions, expected):
    assert opened_rank(actions, search, "B2") == expected


def test_run_row_counts_top_hits_by_half_and_in_verified_episodes():
    top, second = ["search[red shoes]", "click[A1]"], ["search[red shoes]", "click[B2]"]
    stream = [record("A1", top, True), record("B2", second, True), record("A1", top, False), record("A1", top, True)]
    heldout = [record("A1", top, True), record("B2", top, False), record("C3", second, False)]
    row = run_row(stream, heldout, search)
    assert row["stream_first_half"] == (1, 2) and row["stream_second_half"] == (2, 2)
    assert row["stream_verified"] == (2, 3)
    assert row["heldout_top"] == (2, 3) and row["heldout_solved"] == (1, 3)
    assert row["heldout_target_top"] == (1, 3)  # A1 is the top hit of "red shoes"; B2 and C3 are not


def test_gains_by_top_hit_explains_only_the_flips_it_caused():
    top, second, third = (["search[red shoes]", f"click[{x}]"] for x in ("A1", "B2", "C3"))
    method = [record("A1", top, True), record("A1", top, True), record("B2", top, False), record("C3", third, False),
              record("A1", second, True)]
    base = [record("A1", second, False), record("A1", top, False), record("B2", second, True), record("C3", third, True),
            record("A1", second, True)]
    method[1]["task_id"] = base[1]["task_id"] = "A1#1"  # gained, but the base opened the top hit too (then failed)
    method[4]["task_id"] = base[4]["task_id"] = "A1#2"  # both solved: not a flip
    assert gains_by_top_hit(method, base, search) == {"gained": 2, "gained_top_hit": 1, "lost": 2, "lost_top_hit": 1}


def test_main_on_a_tiny_archive(tmp_path, monkeypatch):
    from lit_ascent.results import webshop_clicks

    class Index:
        search = staticmethod(search)

    monkeypatch.setattr(webshop_clicks, "catalog", lambda _: ({}, Index()))
    monkeypatch.setattr(webshop_clicks, "resolve_data_dir", lambda d: d)
    runs = tmp_path / "runs"
    plays = {"base": ["search[red shoes]", "click[B2]"], "ascent": ["search[red shoes]", "click[A1]"]}
    for method, actions in plays.items():
        (runs / method).mkdir(parents=True)
        for suffix, rec in ((".jsonl.gz", {k: v for k, v in record("A1", actions, method == "ascent").items()
                                           if k not in ("model", "tasks_seen")}),
                            (".heldout.jsonl.gz", record("A1", actions, method == "ascent"))):
            with gzip.open(runs / method / f"seed0{suffix}", "wt") as f:
                f.write(json.dumps(rec) + "\n")
    text = main(["--runs", str(runs), "--out", str(tmp_path / "clicks.md")]).read_text()
    assert "| ascent | seed0 | 1/1 | 1/1 | 1/1 |" in text and "| base | seed0 | 0/1 | 1/1 | 0/1 |" in text
    assert "| seed0 | 1 | 1 | 0 | 0 |" in text


def test_main_on_the_committed_webshop_runs_with_the_real_shop(tmp_path):
    """The real search on the archived WebShop efficacy runs: each run's held-out 'solved' cell equals its
    records' count."""
    from lit_ascent.envs.webshop_data import has_data
    from lit_ascent.records import read_records

    if not has_data():
        pytest.skip("no WebShop data (set WEBSHOP_DATA)")
    runs = "docs/results/webshop_efficacy/runs"
    text = main(["--runs", runs, "--out", str(tmp_path / "clicks.md")]).read_text()
    rows = {tuple(cells[:2]): cells[2:] for line in text.splitlines()
            if len(cells := [c.strip() for c in line.strip("|").split("|")]) == 8 and cells[0] in ("base", "ascent")}
    assert len(rows) == 6  # base and ascent, seeds 0-2
    for (method, seed), cells in rows.items():
        records = [r for r in read_records(f"{runs}/{method}/{seed}.heldout.jsonl.gz") if r["model"] == "adapted"]
        assert cells[2] == f"{sum(r['verified'] for r in records)}/{len(records)}"
