"""WebShop offline: the reward against hand-computed cases, deterministic search, every page's
observation, invalid actions, the data checks, the fixed splits and the oracle."""
from __future__ import annotations

import shutil

import pytest

from lit_ascent.envs.webshop import WebShopEnv, goal_query, parse_web_action
from lit_ascent.envs.webshop_data import (
    DATA_FILES,
    NO_PRICE_BOUND,
    Goal,
    Product,
    has_data,
    load_products,
    parse_pricing,
    price_bound,
    resolve_data_dir,
)
from lit_ascent.envs.webshop_oracle import oracle_query, solve
from lit_ascent.envs.webshop_reward import normalize_color, reward, type_reward
from lit_ascent.bm25 import BM25Index

DATA = resolve_data_dir()
if not has_data(DATA):
    pytest.skip(f"no WebShop data in {DATA} (set WEBSHOP_DATA)", allow_module_level=True)


def product(asin="A1", name="Cotton Throw Blanket", query="throw blankets", category="Home › Bedding › Blankets",
            attributes=("cotton",), description="", price=20.0, options=(("color", ("blue", "grey")),)) -> Product:
    return Product(asin, name, "home", query, category, description, ("soft",), price, f"${price}", options,
                   attributes)


def words(text: str) -> frozenset[str]:
    """A stand-in noun tagger for the rule tests: every word is a noun."""
    return frozenset(text.lower().split())


GOAL = Goal("A1#0", "A1", "a blue cotton blanket", ("cotton", "machine washable"), (("color", "blue"),), 30.0)


# --- the reward ---------------------------------------------------------------------------------

def test_reward_target_with_every_option_under_the_bound_is_one():
    target = product(description="Machine washable.")
    r = reward(target, target, GOAL, {"color": "blue"}, noun_fn=words)
    assert (r.total, r.r_type, r.attribute_matches, r.option_matches, r.price_ok) == (1.0, 1.0, 2, 1, True)


@pytest.mark.parametrize("chosen,price,expected", [
    ({"color": "grey"}, 20.0, (1 + 0 + 1) / 4),   # wrong option; 'machine washable' not in the text
    ({}, 20.0, (1 + 0 + 1) / 4),                  # no option chosen
    ({"color": "blue"}, 35.0, (1 + 1 + 0) / 4),   # over the bound
    ({"color": "blue"}, 30.0, (1 + 1 + 1) / 4),   # at the bound counts as under it
])
def test_reward_counts_attributes_options_and_price(chosen, price, expected):
    bought = product(price=price)
    assert reward(bought, product(), GOAL, chosen, noun_fn=words).total == pytest.approx(expected)


def test_attribute_matches_by_fuzzy_attribute_or_by_text():
    by_attribute = product(attributes=("Cotton", "machine-washable"))  # case and punctuation ignored
    by_text = product(attributes=(), description="100% cotton, machine washable")
    assert reward(by_attribute, product(), GOAL, {}, noun_fn=words).attribute_matches == 2
    assert reward(by_text, product(), GOAL, {}, noun_fn=words).attribute_matches == 2


def test_type_reward_rules():
    target = product()
    # score > 0.2 alone is a match; 0.1 <= score <= 0.2 with no query / category match: 0.5
    assert type_reward(target, target, 1.0) == 1.0
    other = product(query="rugs", category="Home › Rugs")
    assert type_reward(other, target, 0.2) == 0.5
    assert type_reward(product(category="Home › Kitchen"), target, 0.2) == 1.0  # query shared
    assert type_reward(product(query="x", category="Home › Bedding › Sheets"), target, 0.2) == 1.0  # 2 levels
    assert type_reward(other, target, 0.05) == 0.1 and type_reward(product(), target, 0.0) == 0.0


def test_reward_scales_by_type():
    rug = product(asin="R", name="Area Rug", query="rugs", category="Garden › Rugs")
    assert reward(rug, product(), GOAL, {"color": "blue"}, noun_fn=words).total == 0.0  # no shared noun


def test_colour_options_are_reduced_to_their_colour():
    assert normalize_color("navy blue") == "blue" and normalize_color("large") == "large"
    goal = Goal("A1#0", "A1", "", (), (("color", "dark blue"),), NO_PRICE_BOUND)
    assert reward(product(), product(), goal, {"color": "blue"}, noun_fn=words).option_matches == 1


def test_spacy_nouns_give_the_target_full_title_score():
    products = load_products(DATA)
    target = next(p for p in products.values() if p.instruction)
    assert reward(target, target, Goal("g", target.asin, "", (), (), NO_PRICE_BOUND), {}).title_score == 1.0


def test_price_rules():
    assert parse_pricing("$19.97", "X") == (19.97, "$19.97")
    assert parse_pricing("", "X") == (100.0, "$100.0")
    price, tag = parse_pricing("$10.00 - $15.00", "X")
    assert 10.0 <= price <= 15.0 and tag == "$10.0 to $15.0" and parse_pricing("$10.00 - $15.00", "X")[0] == price
    assert price_bound(19.97, "g") in (30.0, 40.0, 50.0)  # two of 20, 30, 40, 50: the larger
    assert price_bound(985.0, "g") == NO_PRICE_BOUND   # only 990 above it


# --- search -------------------------------------------------------------------------------------

def test_search_is_deterministic_with_ties_in_data_order():
    search = BM25Index(["c", "a", "b", "d"], ["red shoe", "red shoe", "blue shoes", "hat"])
    assert search.search("Red shoes") == ["c", "a", "b"]  # stems: shoe(s); 'hat' shares nothing
    assert search.search("the of") == [] and search.search("zebra") == []
    assert search.terms("Shoes and hats") == ["shoe", "hat"]


def test_catalog_search_repeats_and_returns_at_most_50():
    env = WebShopEnv()
    _, search = env.catalog()
    first = search.search("long clip in hair extension natural looking")
    assert first == search.search("long clip in hair extension natural looking") and len(first) == 50


# --- pages and actions --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def env():
    return WebShopEnv()


def test_every_page_and_its_buttons(env):
    task = env.tasks()[0]
    goal = env.goals()[task.task_id]
    first = env.reset(task)
    assert first == f"WebShop\nInstruction:\n{goal.instruction}\n[Search]" and env.buttons() == []
    r = env.step(f"search[{goal_query(goal)}]")
    assert r.valid and r.observation.startswith("[Back to Search]\nPage 1 (Total results: 50)\n[Next >]\n[")
    assert env.buttons()[:2] == ["back to search", "next >"] and len(env.buttons()) == 12
    page2 = env.step("click[Next >]").observation
    assert page2.splitlines()[1:4] == ["Page 2 (Total results: 50)", "[< Prev]", "[Next >]"]
    assert env.step("click[< prev]").observation == r.observation
    asin = env.buttons()[2].upper()
    item = env.step(f"click[{asin}]").observation
    product = env.catalog()[0][asin]
    assert item.startswith("[Back to Search]\n[< Prev]\n") and f"Price: {product.price_tag}\nRating: N.A." in item
    assert item.endswith("[Description]\n[Features]\n[Reviews]\n[Buy Now]")
    features = env.step("click[features]").observation
    assert features == "[Back to Search]\n[< Prev]\n" + "\n".join(product.bullets)
    assert env.step("click[< Prev]").observation == item
    assert env.step("click[reviews]").observation == "[Back to Search]\n[< Prev]"
    env.step("click[< prev]"), env.step("click[< prev]")
    assert env.step("click[back to search]").observation == first


def test_option_click_buy_and_reward_info(env):
    task = next(t for t in env.tasks() if env.goals()[t.task_id].options)
    goal = env.goals()[task.task_id]
    env.reset(task)
    actions = solve(env, task)
    for action in actions[:-1]:
        r = env.step(action)
        assert r.valid and not r.done
    assert r.observation == f"You have clicked {goal.options[-1][1]}."
    done = env.step(actions[-1])
    assert done.done and done.verified and done.info["reward"] == 1.0 and done.info["asin"] == goal.asin
    assert done.observation.endswith("Your score (min 0.0, max 1.0): 1.00")
    assert not env.step("click[buy now]").valid  # after the purchase


def test_wrong_option_buys_below_one_and_is_not_verified(env):
    task = next(t for t in env.tasks() if any(len(v) > 1 for _, v in env.catalog()[0][env.goals()[t.task_id].asin].options))
    goal = env.goals()[task.task_id]
    env.reset(task)
    for action in solve(env, task)[:-1 - len(goal.options)]:
        env.step(action)
    name, wanted = goal.options[0]
    other = next(v for n, vs in env.catalog()[0][goal.asin].options if n == name for v in vs if v != wanted)
    env.step(f"click[{other}]")
    r = env.step("click[buy now]")
    assert r.done and not r.verified and r.info["score"] == r.info["reward"] < 1.0


@pytest.mark.parametrize("action,why", [
    ("buy the blanket", "is not search[QUERY] or click[BUTTON]"),
    ("search[]", "the query is empty"),
    ("click[B000000000]", "there is no button [B000000000] on this page"),
    ("click[next >]", "there is no button [next >] on this page"),
])
def test_invalid_actions_on_the_search_page(env, action, why):
    first = env.reset(env.tasks()[1])
    r = env.step(action)
    assert not r.valid and not r.done and why in r.observation and r.observation.startswith("Invalid action: ")
    assert env.render() == first


def test_search_off_the_search_page_is_invalid(env):
    env.reset(env.tasks()[1])
    page = env.step("search[blanket]").observation
    r = env.step("search[shoes]")
    assert not r.valid and "click[back to search] first" in r.observation and env.render() == page


def test_parse_web_action():
    assert parse_web_action(" Search[ red shoes ] ") == ("search", "red shoes")
    assert parse_web_action("click[Buy Now]") == ("click", "Buy Now")
    assert parse_web_action("click Buy Now") is None and parse_web_action("look[x]") is None


def test_step_before_reset_and_unknown_goal():
    env = WebShopEnv()
    with pytest.raises(RuntimeError, match="reset"):
        env.step("search[x]")
    with pytest.raises(ValueError, match="unknown goal"):
        env.reset(env.tasks()[0].__class__("webshop", "NOPE#0"))


def test_fresh_is_independent(env):
    env.reset(env.tasks()[0])
    other = env.fresh()
    other.reset(env.tasks()[1])
    env.step("search[shoes]")
    assert other.render().startswith("WebShop\n") and env.render().startswith("[Back to Search]")


# --- data, splits, goals ------------------------------------------------------------------------

def test_missing_and_corrupted_files_name_the_path_and_checksum(tmp_path):
    for name in DATA_FILES:
        shutil.copy(DATA / name, tmp_path / name)
    (tmp_path / "items_ins_v2_1000.json").write_text("{}")
    assert has_data(tmp_path)  # present, not yet checked
    with pytest.raises(ValueError, match=f"items_ins_v2_1000.json is corrupted.*expected {DATA_FILES['items_ins_v2_1000.json']}"):
        load_products(tmp_path)
    (tmp_path / "items_shuffle_1000.json").unlink()
    assert not has_data(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}/items_shuffle_1000.json.*{DATA_FILES['items_shuffle_1000.json']}"):
        WebShopEnv(data_dir=str(tmp_path)).tasks()


def test_splits_are_fixed_disjoint_by_product_and_counted():
    parts = {p: WebShopEnv(partition=p).tasks() for p in ("demo", "stream", "heldout", "all")}
    assert {p: len(t) for p, t in parts.items()} == {"demo": 100, "stream": 251, "heldout": 64, "all": 415}
    asins = {p: {t.info()["asin"] for t in tasks} for p, tasks in parts.items()}
    assert not asins["demo"] & asins["stream"] and not asins["stream"] & asins["heldout"]
    assert not asins["demo"] & asins["heldout"]
    assert [t.task_id for t in WebShopEnv(partition="stream").tasks()] == [t.task_id for t in parts["stream"]]
    many = WebShopEnv(partition="heldout", goals_per_product=3).tasks()
    assert {t.info()["asin"] for t in many} == asins["heldout"] and len(many) > 64


def test_goal_counts_and_text():
    env = WebShopEnv(partition="all", goals_per_product=10**6)
    goals = env.goals()
    assert len(goals) == 6910  # each instruction product's instruction x its option combinations
    g = next(g for g in goals.values() if len(g.options) == 2 and g.price_upper < NO_PRICE_BOUND)
    (n1, v1), (n2, v2) = g.options
    assert g.instruction.endswith(f" with {n1}: {v1}, and {n2}: {v2}, and price lower than {g.price_upper:.2f} dollars")


@pytest.mark.parametrize("bad,match", [({"partition": "train"}, "partition"), ({"goals_per_product": 0}, "goals_per")])
def test_bad_arguments(bad, match):
    with pytest.raises(ValueError, match=match):
        WebShopEnv(**bad)


def test_bad_split_sizes():
    with pytest.raises(ValueError, match="must leave stream products"):
        WebShopEnv(demo_size=300, heldout_size=200).tasks()


# --- the oracle ---------------------------------------------------------------------------------

def test_oracle_buys_every_stream_goal_at_reward_one():
    env = WebShopEnv(partition="stream")
    fallbacks = 0
    for task in env.tasks():
        env.reset(task)
        for action in solve(env, task):
            r = env.step(action)
            assert r.valid, (task.task_id, action, r.observation)
        assert r.done and r.verified, (task.task_id, r.info)
        fallbacks += oracle_query(env, task)[1]
    assert fallbacks < 20  # the goal's words find the target for all but a few


# --- warm-start demonstrations ------------------------------------------------------------------

def test_demos_replay_verified_with_their_mistakes():
    from lit_ascent.tiny import byte_tokenizer
    from lit_ascent.warmstart.demos import build_demos
    from lit_ascent.warmstart.sources import evaluation_source, training_source
    from lit_ascent.warmstart.webshop_demos import ERROR_KINDS

    source = training_source("webshop", [2], seed=0)
    assert {t.info()["partition"] for t in source.tasks} == {"demo"} and len(source.tasks) > 100
    counts = {"plain": 3, "recovery": 6, "hindsight": 2}
    demos, stats = build_demos(byte_tokenizer(), source.env, source.tasks, counts, source.scripts)
    assert stats.kept == counts and set(stats.error_kinds) == set(ERROR_KINDS)
    for demo in demos:
        turns = demo.episode.turns
        assert demo.episode.verified and demo.episode.score == 1.0 and turns[-1].action == "click[buy now]"
        assert [t.index for t in turns if not t.valid] == (list(demo.mistake_turns)
                                                            if demo.error_kind in ("search_button", "buy_typo") else [])
        if demo.error_kind == "wrong_item":
            assert turns[demo.mistake_turns[0] + 1].action == "click[< prev]"
    _, eval_tasks, _ = evaluation_source("webshop", [2], None)
    demo_asins = {t.info()["asin"] for t in source.tasks}
    assert demo_asins.isdisjoint(t.info()["asin"] for t in eval_tasks)


def test_bench_plays_the_oracle_and_times_every_call(tmp_path):
    from lit_ascent.bench.webshop import main

    assert main(["--partition", "heldout", "--out", str(tmp_path / "b")]) == 0
    import json

    result = json.loads((tmp_path / "b.json").read_text())
    assert result["goals"] == result["oracle_reward_1"] == 64 and result["reset"]["n"] == 64
    assert result["step_search"]["n"] >= 64 and result["step_all"]["n"] == result["step_search"]["n"] + result["step_click"]["n"]
    assert "| reset | 64 |" in (tmp_path / "b.md").read_text()
