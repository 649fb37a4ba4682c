"""What the model writer (memory.writer: model) writes at 135M: the reference base reflecting on 4 episodes of
the base seed-0 efficacy stream (2 verified, 2 not; first 12 turns, the goal line as the task).

    PYTHONPATH=. python scripts/playbook_writer_probe.py > docs/results/efficacy/playbook_writer_probe.jsonl
"""
import gzip
import json

import torch

from lit_ascent.envs import Task
from lit_ascent.memory import reflect
from lit_ascent.models import ModelConfig, load_policy
from lit_ascent.trajectory import Episode, Turn

torch.set_num_threads(1)
policy = load_policy(ModelConfig(warm_start_adapter="adapters/textcraft-ref", dtype="float32"))
recs = [json.loads(l) for l in gzip.open("docs/results/efficacy/runs/base/seed0.jsonl.gz")]
picked = [r for r in recs if r["verified"]][:2] + [r for r in recs if not r["verified"]][:2]
for r in picked:
    item = r["task_id"].split(":")[1].replace("_", " ")
    turns = [Turn(i, t, a, "", v, (0, 0)) for i, (t, a, v) in enumerate(zip(r["texts"], r["actions"], r["valid"]))][:12]
    ep = Episode(task=Task("textcraft", r["task_id"]), system="", first_observation=f"Goal: craft {item}.", verified=r["verified"])
    ep.turns = turns
    lesson = reflect(policy, ep, 48)
    print(json.dumps({"task": r["task_id"], "verified": r["verified"], "lesson": lesson}))
