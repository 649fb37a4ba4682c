"""Every YAML under configs/ parses with its CLI; every method runs end to end on the debug config."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from callbacks import InvalidTurnFilter, StreamStats, VerificationGate
from lit_ascent.cli import TRAINER_DEFAULTS, AscentCLI, main
from lit_ascent.cycles import build_parser as cycles_parser
from lit_ascent.memory import NoMemory, Playbook, ProceduralMemory
from lit_ascent.module import OaTTTModule
from lit_ascent.objectives import TTOPSD, Distillation, Imitation, NoUpdate, Reinforce, ReinforcePP
from datamodules import TaskStreamDataModule

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
OVERLAYS = sorted([*CONFIGS.glob("methods/*.yaml"), *CONFIGS.glob("ablations/*.yaml")])
DEMO = CONFIGS / "demo.yaml"
"""The quick-start overlay on the TextCraft config: a shorter stream, not a method."""


def is_train_config(path: Path) -> bool:
    """A complete train.py config (other entry points, e.g. lit_ascent.cycles, have their own parsers)."""
    keys = yaml.safe_load(path.read_text()) or {}
    return "trainer" in keys and "data" in keys


ALL_YAML = sorted(CONFIGS.rglob("*.yaml"))
ENV_CONFIGS = [p for p in ALL_YAML if p not in [*OVERLAYS, DEMO] and is_train_config(p)]
METHODS = sorted(p.stem for p in CONFIGS.glob("methods/*.yaml"))
CYCLES_BASES = (CONFIGS / "resail/sdpo.yaml", CONFIGS / "resail/debug_sdpo.yaml")
"""The complete lit_ascent.cycles configs; the other cycles files overlay one of them."""
CYCLES_OVERLAYS = sorted(p for p in CONFIGS.glob("resail/*.yaml")
                         if p not in CYCLES_BASES and "model" not in yaml.safe_load(p.read_text()))

EXPECTED = {  # method -> (objective class, method callbacks)
    "base": (NoUpdate, []),
    "ascent": (Distillation, [VerificationGate, InvalidTurnFilter]),
    "rft": (Imitation, [VerificationGate]),
    "rft_kl": (Imitation, [VerificationGate]),
    "imitation": (Imitation, []),
    "reinforce": (Reinforce, []),
    "reinforce_pp": (ReinforcePP, []),
    "tt_opsd": (TTOPSD, [VerificationGate, InvalidTurnFilter]),
    "procedural": (NoUpdate, []),
    "playbook": (NoUpdate, []),
    "ascent_procedural": (Distillation, [VerificationGate, InvalidTurnFilter]),
    "ascent_playbook": (Distillation, [VerificationGate, InvalidTurnFilter]),
}
MEMORY = {"procedural": ProceduralMemory, "playbook": Playbook, "ascent_procedural": ProceduralMemory,
          "ascent_playbook": Playbook}
"""The methods with an in-context memory (the rest: NoMemory)."""


def parse(*configs: Path, extra: tuple[str, ...] = ()) -> AscentCLI:
    args = [a for c in configs for a in ("--config", str(c))] + list(extra)
    return AscentCLI(OaTTTModule, TaskStreamDataModule, trainer_defaults=TRAINER_DEFAULTS, run=False, args=args)


def method_callbacks(cli) -> list[type]:
    return [type(c) for c in cli.trainer.callbacks if isinstance(c, (VerificationGate, InvalidTurnFilter))]


@pytest.mark.parametrize("config", ALL_YAML, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_yaml_loads(config):
    assert isinstance(yaml.safe_load(config.read_text()), dict)


def test_expected_matrix_is_complete():
    assert {"debug.yaml", "textcraft/ascent.yaml"} <= {str(p.relative_to(CONFIGS)) for p in ENV_CONFIGS}
    assert set(METHODS) == set(EXPECTED)
    assert {p.stem for p in CONFIGS.glob("ablations/*.yaml")} == {"reverse_kl", "jsd", "pi_actions", "pi_full",
                                                                   "no_filter", "replay", "memory_floor", "valid_steps"}


def test_memory_floor_stacks_on_a_memory_method():
    cli = parse(*(CONFIGS / c for c in ("textcraft/ascent.yaml", "methods/procedural.yaml", "ablations/memory_floor.yaml")))
    memory = cli.model.memory
    assert type(cli.model.objective) is NoUpdate and type(memory) is ProceduralMemory
    assert (memory.min_overlap, memory.k, memory.max_tokens) == (0.3, 2, 1024)


@pytest.mark.parametrize("config", ENV_CONFIGS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_env_config_parses(config):
    cli = parse(config)
    assert isinstance(cli.model.objective, Distillation)
    assert any(isinstance(c, StreamStats) for c in cli.trainer.callbacks)


@pytest.mark.parametrize("env", ENV_CONFIGS, ids=lambda p: str(p.relative_to(CONFIGS)))
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_overlay_parses_on_every_env_config(env, overlay):
    cli = parse(env, overlay)
    assert cli.trainer.logger.name == overlay.stem  # runs land in separate folders
    if overlay.parent.name == "methods":
        objective, callbacks = EXPECTED[overlay.stem]
        assert type(cli.model.objective) is objective
        assert method_callbacks(cli) == callbacks
        assert type(cli.model.memory) is MEMORY.get(overlay.stem, NoMemory)


def test_demo_overlay_shortens_the_textcraft_stream_and_keeps_ascent():
    ref, demo = parse(CONFIGS / "textcraft/ascent.yaml"), parse(CONFIGS / "textcraft/ascent.yaml", DEMO)
    assert (demo.datamodule.num_tasks, demo.datamodule.seed, demo.model.rollout_cfg.max_turns) == (3, 244, 10)
    assert demo.trainer.logger.name == "demo" and demo.config.model.llm == ref.config.model.llm
    assert type(demo.model.objective) is Distillation and vars(demo.model.objective) == vars(ref.model.objective)
    assert method_callbacks(demo) == [VerificationGate, InvalidTurnFilter]


def test_method_overlays_set_their_defining_arguments():
    env = CONFIGS / "textcraft/ascent.yaml"
    assert parse(env, CONFIGS / "methods/rft_kl.yaml").model.objective.kl_weight > 0
    assert parse(env, CONFIGS / "methods/rft.yaml").model.objective.kl_weight == 0
    assert parse(env, CONFIGS / "methods/reinforce_pp.yaml").model.objective.kl_weight > 0


@pytest.mark.parametrize("ablation,changed", [
    ("reverse_kl", {"divergence": "reverse_kl"}),
    ("jsd", {"divergence": "jsd", "beta": 0.5}),
    ("pi_actions", {"pi_content": "actions"}),
    ("pi_full", {"pi_content": "full"}),
    ("no_filter", {}),
    ("replay", {}),
    ("valid_steps", {"valid_steps_only": True}),
])
def test_ablation_differs_from_ascent_only_where_it_should(ablation, changed):
    env = CONFIGS / "textcraft/ascent.yaml"
    ref, abl = parse(env), parse(env, CONFIGS / f"ablations/{ablation}.yaml")
    assert type(abl.model.objective) is Distillation
    assert vars(abl.model.objective) == {**vars(ref.model.objective), **changed}
    expected_callbacks = [VerificationGate] if ablation == "no_filter" else [VerificationGate, InvalidTurnFilter]
    assert method_callbacks(abl) == expected_callbacks
    assert abl.config.model.llm == ref.config.model.llm and abl.config.data == ref.config.data
    assert (abl.model.replay_cfg.k, ref.model.replay_cfg.k) == ((4, 0) if ablation == "replay" else (0, 0))


@pytest.mark.parametrize("budget", sorted(CONFIGS.glob("efficacy/lr*.yaml")), ids=lambda p: p.stem)
def test_efficacy_overlays_set_the_budget_their_name_says_and_nothing_else(budget):
    lr, steps, k = re.fullmatch(r"lr([0-9.e-]+)_s(\d+)_k(\d+)", budget.stem).groups()
    env, heldout, method = (CONFIGS / name for name in ("textcraft/ascent.yaml", "heldout/textcraft.yaml",
                                                        "methods/rft.yaml"))
    ref = parse(env, heldout, method)
    run = parse(env, heldout, CONFIGS / "efficacy/no_initial.yaml", budget, method)
    assert (run.model.optim_cfg.lr, run.model.optim_cfg.updates_per_task, run.model.replay_cfg.k) == \
        (float(lr), int(steps), int(k))
    assert ref.config.heldout.include_initial and not run.config.heldout.include_initial
    assert type(run.model.objective) is Imitation and method_callbacks(run) == [VerificationGate]
    changed = {key for key, value in flat(run.config.as_dict()).items() if flat(ref.config.as_dict()).get(key) != value}
    assert changed <= {"config", "heldout.include_initial", "model.optim.lr", "model.optim.updates_per_task",
                       "model.replay.k"}


def cycles_base(overlay: Path) -> Path:
    """The base a cycles overlay applies to: the debug runs have their own."""
    return CYCLES_BASES[1] if overlay.stem.startswith("debug_") else CYCLES_BASES[0]


def flat(tree: dict, prefix: str = "") -> dict:
    """Nested dict -> {"a.b.c": leaf}."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def parse_cycles(*configs: Path) -> dict:
    cfg = cycles_parser().parse_args([a for c in configs for a in ("--config", str(c))]).as_dict()
    cfg.pop("config")
    return flat(cfg)


def test_cycles_matrix_is_complete():
    assert {p.stem for p in CYCLES_OVERLAYS} == {"sdpo_resail", "oel", "oel_resail", "sdpo_valid", "sdpo_resail_valid",
                                                  "debug_sdpo_resail", "debug_oel", "debug_oel_resail"}


@pytest.mark.parametrize("overlay", CYCLES_OVERLAYS, ids=lambda p: p.stem)
def test_cycles_overlay_changes_only_the_keys_it_names(overlay):
    ref, cfg = parse_cycles(cycles_base(overlay)), parse_cycles(cycles_base(overlay), overlay)
    named = flat(yaml.safe_load(overlay.read_text()))
    assert named["log_dir"] == f"runs/resail/{overlay.stem}"  # runs land in separate folders
    assert {k: cfg[k] for k in named} == named
    assert {k: v for k, v in cfg.items() if k not in named} == {k: v for k, v in ref.items() if k not in named}


@pytest.mark.parametrize("overlay", [None, *(p for p in CYCLES_OVERLAYS if not p.stem.startswith("debug"))],
                         ids=lambda p: p.stem if p else "sdpo")
def test_the_reference_base_overlay_goes_with_every_cycles_method(overlay):
    reference = CONFIGS / "resail/reference/textcraft.yaml"
    method = [overlay] if overlay else []
    cfg = parse_cycles(CYCLES_BASES[0], reference, *method)
    assert cfg["llm.warm_start_adapter"] == "adapters/textcraft-ref" and cfg["rollout.engine"] == "fused"
    alone = parse_cycles(CYCLES_BASES[0], *method)  # the method's own keys are untouched by the overlay
    named = flat(yaml.safe_load(reference.read_text()))
    assert {k: v for k, v in cfg.items() if k not in named and not k.startswith("env.")} == \
        {k: v for k, v in alone.items() if k not in named and not k.startswith("env.")}


@pytest.mark.parametrize("overlay", [None, *(p for p in CYCLES_OVERLAYS if not p.stem.startswith("debug"))],
                         ids=lambda p: p.stem if p else "sdpo")
def test_the_cpu_schedule_changes_only_the_update_budget(overlay):
    """scripts/resail_cycles.sh's CPU schedule: 10 updates x lr 3e-4 per cycle (the lr x updates of 30 x 1e-4)."""
    method, reference = [overlay] if overlay else [], CONFIGS / "resail/reference/textcraft.yaml"
    paper = parse_cycles(CYCLES_BASES[0], reference, *method)
    cpu = parse_cycles(CYCLES_BASES[0], reference, CONFIGS / "resail/reference/cpu.yaml", *method)
    assert {k for k in cpu if cpu[k] != paper[k]} == {"optim.lr", "cycles.updates_per_cycle"}
    assert cpu["optim.lr"] * cpu["cycles.updates_per_cycle"] == pytest.approx(
        paper["optim.lr"] * paper["cycles.updates_per_cycle"])
    assert paper["llm.gradient_checkpointing"] is True  # batches of 8 long episodes: > 24 GB without it


TINY_RUN = ("--data.env.init_args.num_tasks", "2", "--data.shuffle", "false",
            "--model.rollout.max_turns", "1", "--model.rollout.max_new_tokens", "4",
            "--trainer.enable_progress_bar", "false", "--report.verbose", "false",
            "--adapter_checkpoint.every_n_tasks", "0")
GATED = {"ascent", "rft", "rft_kl", "tt_opsd", "ascent_procedural", "ascent_playbook"}
NO_UPDATE = {"base", "procedural", "playbook"}


@pytest.mark.parametrize("method", METHODS)
def test_debug_method_runs_end_to_end(method, tmp_path):
    args = ["fit", "--config", str(CONFIGS / "debug.yaml"), "--config", str(CONFIGS / f"methods/{method}.yaml"),
            "--trainer.logger.init_args.save_dir", str(tmp_path), *TINY_RUN]
    main(args)
    log = tmp_path / method / "version_0" / "experience.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    # ScriptedEnv(verify_every=2), no shuffle: task-0 verified, task-1 failed
    assert [r["verified"] for r in records] == [True, False]
    updates = [r["updates"] for r in records]
    if method in NO_UPDATE:
        assert updates == [0, 0]
    elif method in GATED:
        assert updates == [1, 0]
    else:
        assert updates == [1, 1]
        assert records[1]["train/updates_from_failed_share"] == pytest.approx(0.5)
    assert all("stream/invalid_rate_window" in r and "diagnostics/drift_kl" in r for r in records)
    if method in MEMORY:  # task 1 sees what task 0 left: the verified episode, or its lessons
        assert records[0]["memory/size"] >= 1 and records[1]["memory/shown"] >= 1
        assert records[1]["memory_text"].startswith(("Memory:", "Playbook:")) and records[1]["memory/tokens"] > 0
    else:
        assert "memory/size" not in records[0] and "memory_text" not in records[0]
