"""One dataclass per training entry point: its fields' defaults are the only defaults and
their `help` is the command-line help (as TRL's configs do)."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TypeVar, get_type_hints

T = TypeVar("T")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Every --help: the defaults after each option's help, the epilog's recipe as written."""


def option(default, help: str):
    return dataclasses.field(default=default, metadata={"help": help})


def comma_list(text: str) -> list[str]:
    """The items of a comma-separated option, blanks dropped ("arith, pyfunc," -> ["arith", "pyfunc"])."""
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_config(cls: type[T], argv: list[str] | None = None, description: str | None = None) -> T:
    """Command-line flags --field-name for every field of the dataclass `cls`."""
    parser = argparse.ArgumentParser(description=description or cls.__doc__,
                                     formatter_class=HelpFormatter)
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        flag = "--" + f.name.replace("_", "-")
        required = f.default is dataclasses.MISSING
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=f.metadata["help"])
            continue
        convert = {int: int, float: float, Path: Path}.get(kind, str)
        if kind in (Path | None, str | None, float | None, int | None):
            convert = {Path | None: Path, str | None: str, float | None: float, int | None: int}[kind]
        parser.add_argument(flag, type=convert, required=required, default=None if required else f.default,
                            help=f.metadata["help"])
    return cls(**vars(parser.parse_args(argv)))
