"""One way to define a command: every `python -m cospec_local...` and `python -m converters...`
entry point is a dataclass whose fields' defaults are the only defaults and whose `help` is the
command-line help (as TRL's configs do), read by parse_config. (`cospec-local` itself is click.)"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TypeVar, get_type_hints

T = TypeVar("T")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Every --help: the defaults after each option's help (where there is one), the epilog's recipe
    as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.required:
            return action.help or ""
        return super()._get_help_string(action)


REQUIRED = dataclasses.MISSING  # option(REQUIRED, ...): a field the command line must give


def option(default, help: str, flags: tuple[str, ...] = (), choices: tuple[str, ...] = (), positional: bool = False):
    """A config field: its default (REQUIRED: none), its help, its spellings on the command line
    (default: --field-name; the model flags are -m/--model and -md/--model-draft, as the CLI and
    llama.cpp), for a text field the values it may take, and whether it is a positional argument
    (a list[str] one takes any number of values, and defaults to none)."""
    metadata = {"help": help, "flags": flags, "choices": choices or None, "positional": positional}
    if isinstance(default, list):
        if default:
            raise TypeError("a list option's default is empty (the values the command line gives)")
        return dataclasses.field(default_factory=list, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _flags(f: dataclasses.Field) -> tuple[str, ...]:
    return f.metadata.get("flags") or ("--" + f.name.replace("_", "-"),)


def comma_list(text: str) -> list[str]:
    """The items of a comma-separated option, blanks dropped ("arith, pyfunc," -> ["arith", "pyfunc"])."""
    return [item.strip() for item in text.split(",") if item.strip()]


# The types a field may have, each with what reads its text (a positional field may also be a
# list[str], of any length; a bool is a --flag/--no-flag pair).
_READERS = {int: int, float: float, str: str, Path: Path, int | None: int, float | None: float, str | None: str,
            Path | None: Path}


def _reader(cls: type, f: dataclasses.Field, kind) -> type:
    if kind not in _READERS:
        raise TypeError(f"{cls.__name__}.{f.name}: a field of type {kind} is not read from a command line")
    return _READERS[kind]


def parse_config(cls: type[T], argv: list[str] | None = None, description: str | None = None,
                 epilog: str | None = None) -> T:
    """Command-line flags for every field of the dataclass `cls` (option's flags, else --field-name)."""
    parser = argparse.ArgumentParser(description=description or cls.__doc__, epilog=epilog,
                                     formatter_class=HelpFormatter)
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind, help = hints[f.name], f.metadata["help"]
        if f.metadata.get("positional"):
            if kind == list[str]:
                parser.add_argument(f.name, nargs="*", help=help)
            else:
                parser.add_argument(f.name, type=_reader(cls, f, kind), help=help)
        elif kind is bool:
            parser.add_argument(*_flags(f), dest=f.name, action=argparse.BooleanOptionalAction, default=f.default,
                                help=help)
        else:
            required = f.default is dataclasses.MISSING
            parser.add_argument(*_flags(f), dest=f.name, type=_reader(cls, f, kind), required=required,
                                choices=f.metadata.get("choices"), default=None if required else f.default, help=help)
    return cls(**vars(parser.parse_args(argv)))


def config_args(config) -> list[str]:
    """The command line that parse_config reads back as `config`: a caller that runs an entry point
    in a process of its own (a recipe) builds the config, not the argument list."""
    out: list[str] = []
    positional: list[str] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.metadata.get("positional"):
            positional += [str(v) for v in value] if isinstance(value, list) else [str(value)]
            continue
        if value is None or (f.default is not dataclasses.MISSING and value == f.default):
            continue
        flag = _flags(f)[-1]  # the long spelling
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        else:
            out += [flag, str(value)]
    return out + positional
