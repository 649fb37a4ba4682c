"""Command lines of the programs: one jsonargparse parser over a typed dataclass of options.

Each program (``python -m lit_ascent.warmstart``, ``.results.compare``, ``.bench`` ...) declares its options
once, as a dataclass with a type, a default and an attribute docstring per field, and validates them in
``__post_init__``; ``parse_options`` turns a command line into that dataclass. The options keep the
argparse forms the programs have always had, so documented commands stay valid:

- a field ``num_tasks`` is the option ``--num-tasks`` (extra spellings: ``metadata={"aliases": [...]}``);
- a ``bool`` field is a flag (``--quick``), a ``list[T]`` field takes its values space-separated
  (``--seeds 0 1 2``; ``metadata={"nargs": 2}`` for a fixed count, ``"action": "extend"`` to repeat it);
- ``metadata={"positional": True}`` makes a field positional (``report ROOT``);
- ``metadata={"group": title}`` puts an option under its own heading in ``--help``.

jsonargparse checks every value against the field's type (``int | None``, ``Literal[...]``, ``Path``)
and ``--help`` shows the docstrings and defaults. A ``ValueError`` from ``__post_init__`` exits with
status 2 and its message, which names the option.
"""
from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, TypeVar

import docstring_parser
from jsonargparse import ArgumentParser, DefaultHelpFormatter

Options = TypeVar("Options")


class _HelpFormatter(DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """jsonargparse's help (types, defaults) with the description printed as written (the module docstrings)."""


def flag(name: str) -> str:
    """The command-line spelling of option ``name`` (``num_tasks`` -> ``--num-tasks``)."""
    return "--" + name.replace("_", "-")


def attribute_docs(cls: type) -> dict[str, str]:
    """{field name: its attribute docstring, on one line}."""
    return {p.arg_name: " ".join((p.description or "").split())
            for p in docstring_parser.parse_from_object(cls).params}


def _list_item(hint: Any) -> Any | None:
    """T of a ``list[T]`` or ``list[T] | None`` hint, else None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
    return typing.get_args(hint)[0] if typing.get_origin(hint) is list else None


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _argument(f: dataclasses.Field, hint: Any, doc: str) -> tuple[list[str], dict[str, Any]]:
    """(option strings, add_argument keywords) of one field."""
    meta = f.metadata
    required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    kwargs: dict[str, Any] = {"help": doc}
    if meta.get("positional"):
        names = [f.name]
    else:
        names = [flag(f.name), *meta.get("aliases", ())]
        kwargs |= {"dest": f.name, "required": required}
    item = _list_item(hint)
    if hint is bool:
        if _default(f) is not False:
            raise TypeError(f"{f.name}: a flag's default must be False")
        return names, kwargs | {"action": "store_true"}
    if item is not None:
        kwargs |= {"type": item, "nargs": meta.get("nargs", "+")}
        if "action" in meta:
            kwargs["action"] = meta["action"]
    else:
        kwargs["type"] = hint
    if not required:
        kwargs["default"] = _default(f)
    return names, kwargs


def options_parser(cls: type, prog: str | None = None, description: str | None = None) -> ArgumentParser:
    """A parser with one argument per field of the dataclass ``cls`` (see the module docstring)."""
    parser = ArgumentParser(prog=prog, description=description or cls.__doc__, formatter_class=_HelpFormatter)
    hints, docs = typing.get_type_hints(cls), attribute_docs(cls)
    groups: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        title = f.metadata.get("group")
        target = parser if title is None else groups.setdefault(title, parser.add_argument_group(title))
        names, kwargs = _argument(f, hints[f.name], docs.get(f.name, ""))
        target.add_argument(*names, **kwargs)
    return parser


def parse_options(cls: type[Options], argv: list[str] | None = None, prog: str | None = None,
                  description: str | None = None) -> Options:
    """The options of ``cls`` given on the command line ``argv`` (None: ``sys.argv[1:]``); exits 2 on a bad one."""
    parser = options_parser(cls, prog, description)
    parsed = parser.parse_args(argv)
    try:
        return cls(**{f.name: parsed[f.name] for f in dataclasses.fields(cls)})
    except ValueError as err:
        parser.error(str(err))
