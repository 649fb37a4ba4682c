"""WebShop's 1,000-product data: the products as the original's text environment sees them,
its synthetic goals, and the fixed, disjoint goal splits.

The two files (``items_shuffle_1000.json``, ``items_ins_v2_1000.json``; checksums in
``DATA_FILES``) are WebShop's small data set (Yao et al., 2022). Products are read the way the
original's ``load_products`` reads them: option values lowercased with ``/`` shown as `` | ``,
bullet points stripped, the price range from the ``pricing`` string (no price: $100.00). Where
this module departs from the original, its docstrings say so:

- A product with a price range gets one fixed price inside it from a stable hash of its ASIN
  (the original draws it with the global ``random``); goals' price bounds likewise.
- Goals are the original's synthetic goals (each product's instruction crossed with its option
  combinations, the price bound drawn from ``PRICE_RANGE``); the human-instruction file is not
  part of the 1,000-product set, so there are no human goals.
- Ratings and reviews come from a file that is not part of the set: every product shows
  "Rating: N.A." and an empty reviews page, as the original does for a product it has none for.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from lit_ascent.envs.base import stable_unit

DATA_FILES = {
    "items_shuffle_1000.json": "30a4765c3a327af72d9a9a95a6b2486d516f0fa1d3ecd83681901ce82a21b269",
    "items_ins_v2_1000.json": "f88a36314a397b53b3d9c3fa5878e5f7b26d35019a51ec83fbedeca61a948f6f",
}
"""File name -> sha256 of WebShop's published file."""
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "webshop"
PRICE_RANGE = tuple(10.0 * i for i in range(1, 100))
"""The original's candidate price bounds: $10, $20, ..., $990."""
NO_PRICE_BOUND = 1_000_000.0
"""The original's bound for a product too expensive for ``PRICE_RANGE`` (no price text)."""
SPLIT_SEED = 0
"""Seed of the constant shuffle of the instruction products that fixes the splits."""
PARTITIONS = ("demo", "stream", "heldout", "all")


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """``data_dir``, else ``$WEBSHOP_DATA``, else ``../shared/data/webshop`` next to the repository."""
    chosen = data_dir if data_dir is not None else os.environ.get("WEBSHOP_DATA") or DEFAULT_DATA_DIR
    return Path(chosen).expanduser().resolve()


def has_data(data_dir: str | os.PathLike | None = None) -> bool:
    """Whether every data file is in ``resolve_data_dir(data_dir)`` (unchecked: ``check_file`` checks)."""
    folder = resolve_data_dir(data_dir)
    return all((folder / name).is_file() for name in DATA_FILES)


def check_file(path: Path, sha256: str) -> None:
    """Raise with the path and the expected checksum when the file is missing or not WebShop's."""
    if not path.is_file():
        raise FileNotFoundError(f"WebShop data file missing: {path} (expected sha256 {sha256}; pass "
                                f"data_dir=... or set WEBSHOP_DATA to the folder holding {', '.join(DATA_FILES)})")
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got != sha256:
        raise ValueError(f"WebShop data file {path} is corrupted or not the original: sha256 {got}, "
                         f"expected {sha256}")


@dataclass(frozen=True)
class Product:
    """One product as the pages and the reward see it."""

    asin: str
    name: str
    category: str
    """The crawl's top-level category (``beauty``, ``garden``, ...)."""
    query: str
    """The search query the product was crawled with (lowercased): the reward's type match."""
    product_category: str
    description: str
    bullets: tuple[str, ...]
    price: float
    """The price the reward compares with the goal's bound."""
    price_tag: str
    """The price as the item page shows it: ``$19.97`` or ``$10.99 to $15.99``."""
    options: tuple[tuple[str, tuple[str, ...]], ...]
    """(option name, its values), in the data's order; names and values lowercased."""
    attributes: tuple[str, ...]
    instruction: str | None = None
    instruction_attributes: tuple[str, ...] = ()

    def search_text(self) -> str:
        """What the search indexes: name, description, first bullet point and the options, lowercased."""
        options = ", and ".join(f"{name}: {', '.join(values)}" for name, values in self.options)
        first = self.bullets[0] if self.bullets else ""
        return " ".join([self.name, self.description, first, options]).lower()


def parse_pricing(pricing: str, asin: str) -> tuple[float, str]:
    """(price, price tag) from the data's ``pricing`` string; a range gets a stable price inside it."""
    values = [float(v) for v in (re.sub(r"[^\d.]", "", p) for p in (pricing or "").split("$")[1:]) if v]
    if not values:
        return 100.0, "$100.0"
    if len(values) == 1:
        return values[0], f"${values[0]}"
    low, high = values[:2]
    return low + (high - low) * stable_unit(f"price#{asin}"), f"${low} to ${high}"


def _options(raw) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if not isinstance(raw, dict):
        return ()
    return tuple((name.lower(), tuple(c["value"].strip().replace("/", " | ").lower() for c in contents))
                 for name, contents in raw.items() if contents)


def _product(raw: dict, ins: dict) -> Product:
    price, tag = parse_pricing(raw.get("pricing") or "", raw["asin"])
    bullets = raw.get("small_description") or []
    bullets = [bullets] if isinstance(bullets, str) else bullets
    return Product(
        asin=raw["asin"], name=raw["name"], category=raw.get("category") or "", query=raw["query"].lower().strip(),
        product_category=raw.get("product_category") or "", description=raw.get("full_description") or "",
        bullets=tuple(b.strip() for b in bullets), price=price, price_tag=tag,
        options=_options(raw.get("customization_options")), attributes=tuple(ins.get("attributes", ())),
        instruction=ins.get("instruction"), instruction_attributes=tuple(ins.get("instruction_attributes", ())))


@lru_cache(maxsize=4)
def load_products(data_dir: Path) -> dict[str, Product]:
    """ASIN -> product, in the file's order (duplicate ASINs: the first kept, as the original does)."""
    for name, sha in DATA_FILES.items():
        check_file(data_dir / name, sha)
    raw = json.loads((data_dir / "items_shuffle_1000.json").read_text())
    ins = json.loads((data_dir / "items_ins_v2_1000.json").read_text())
    products: dict[str, Product] = {}
    for p in raw:
        if p["asin"] not in products:
            products[p["asin"]] = _product(p, ins.get(p["asin"], {}))
    return products


@dataclass(frozen=True)
class Goal:
    """One synthetic goal: buy ``asin`` (or a product as good) with these options under the bound."""

    goal_id: str
    """``<asin>#<k>``: the k-th combination of the product's option values (sorted option names)."""
    asin: str
    instruction: str
    attributes: tuple[str, ...]
    options: tuple[tuple[str, str], ...]
    """(option name, wanted value)."""
    price_upper: float


def price_bound(price: float, goal_id: str) -> float:
    """The original's bound: the larger of two draws from the first four ``PRICE_RANGE`` values above
    the price (a stable draw per goal); ``NO_PRICE_BOUND`` when fewer than two are above it."""
    above = [p for p in PRICE_RANGE if p > price][:4]
    if len(above) < 2:
        return NO_PRICE_BOUND
    return max(random.Random(goal_id).sample(above, 2))


GOAL_SEP = "#"
"""Between a goal id's product and its option combination: ``<asin>#<k>``."""


def product_goals(product: Product) -> list[Goal]:
    """Every synthetic goal of a product with an instruction (none without one)."""
    if not product.instruction:
        return []
    names = sorted(name for name, _ in product.options)
    values = dict(product.options)
    goals = []
    for k, combination in enumerate(itertools.product(*(values[n] for n in names))):
        goal_id = f"{product.asin}{GOAL_SEP}{k}"
        options = tuple(zip(names, combination))
        option_text = " with " + ", and ".join(f"{n}: {v}" for n, v in options) if options else ""
        bound = price_bound(product.price, goal_id)
        price_text = f", and price lower than {bound:.2f} dollars" if bound < NO_PRICE_BOUND else ""
        goals.append(Goal(goal_id, product.asin, f"{product.instruction}{option_text}{price_text}",
                          product.instruction_attributes, options, bound))
    return goals


def goal_asin(goal_id: str) -> str:
    """The product of a goal id (``<asin>#<k>``, ``product_goals``)."""
    return goal_id.split(GOAL_SEP)[0]


def split_products(asins: list[str], demo_size: int, heldout_size: int) -> dict[str, str]:
    """ASIN -> ``demo`` | ``stream`` | ``heldout``: sorted, shuffled with ``SPLIT_SEED``; the first
    ``demo_size`` are the warm-start demonstrations' products, the last ``heldout_size`` held out."""
    if demo_size < 0 or heldout_size < 1 or demo_size + heldout_size >= len(asins):
        raise ValueError(f"WebShop: demo_size ({demo_size}) + heldout_size ({heldout_size}) must leave "
                         f"stream products out of {len(asins)} (and heldout_size >= 1)")
    order = sorted(asins)
    random.Random(SPLIT_SEED).shuffle(order)
    cut = len(order) - heldout_size
    return {a: "demo" if i < demo_size else "heldout" if i >= cut else "stream" for i, a in enumerate(order)}
