"""An argparse-like scan of an engine's options against that engine's real flag table.

    values, positionals = scan(["serve", "m", "--max-num-seqs", "8"][1:], table("vllm"), ...)

vLLM and SGLang parse their command lines with argparse; the simulator accepts exactly the options their
parsers accept (sim/flag_tables.py) and reports the errors argparse would print: unrecognized arguments,
a missing value, a value of the wrong type or outside the choices. The scan is hand-written rather than
an argparse parser built from the table because the engines register overlapping aliases (vLLM's
`--enable-expert-parallel`/`--disable-expert-parallel`/`-ep`) that argparse refuses to register twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from specdeploy_engine.sim import flag_tables


class OptionError(ValueError):
    """What argparse would put after "error: " (the caller adds the usage line and the exit status)."""


@dataclass(frozen=True)
class FlagSpec:
    """One option as the engine's parser declares it."""

    dest: str
    nargs: str                   # "0" a switch, "None" exactly one value, "+", "*", "?"
    value: str                   # int, float, str, json, callable, "-" for switches
    options: tuple[str, ...]     # every spelling, as argparse names them in errors
    choices: tuple[str, ...]

    @property
    def label(self) -> str:
        """How argparse names the option in an error: its spellings joined by "/"."""
        return "/".join(self.options)


@cache
def table(engine: str) -> dict[str, FlagSpec]:
    """Option string -> FlagSpec for "vllm" or "sglang"."""
    text = getattr(flag_tables, engine.upper())
    specs: dict[str, FlagSpec] = {}
    for line in text.splitlines():
        dest, nargs, value, options, choices = line.split("\t")
        spec = FlagSpec(
            dest=dest, nargs=nargs, value=value, options=tuple(sorted(options.split(","), key=_argparse_order)),
            choices=() if choices == "-" else tuple(choices.split(",")),
        )
        for option in spec.options:
            specs[option] = spec
    return specs


def _argparse_order(option: str) -> tuple[int, str]:
    """Long spellings first, as the engines declare them (`--tensor-parallel-size/-tp`)."""
    return (0 if option.startswith("--") else 1, option)


def _looks_like_option(token: str) -> bool:
    if not token.startswith("-") or token == "-":
        return False
    try:
        float(token)
    except ValueError:
        return True
    return False   # a negative number is a value, as in argparse


_SIZE_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}


def _int(text: str) -> int:
    """An int, or a human-readable one ("8k", "1M") as vLLM's human_readable_int accepts."""
    try:
        return int(text)
    except ValueError:
        if len(text) > 1 and text[-1] in _SIZE_SUFFIXES:
            return int(float(text[:-1]) * _SIZE_SUFFIXES[text[-1]])
        raise


def _convert(spec: FlagSpec, text: str) -> Any:
    converters: dict[str, Callable[[str], Any]] = {"int": _int, "float": float}
    convert = converters.get(spec.value)
    if convert is not None:
        try:
            value: Any = convert(text)
        except ValueError:
            raise OptionError(f"argument {spec.label}: invalid {spec.value} value: {text!r}") from None
    else:
        value = text
    if spec.choices and text not in spec.choices:
        listed = ", ".join(repr(choice) for choice in spec.choices)
        raise OptionError(f"argument {spec.label}: invalid choice: {text!r} (choose from {listed})")
    return value


@dataclass
class Scan:
    """The result of a scan: values by dest, positionals in order, and the tokens nobody recognised."""

    values: dict[str, Any]
    positionals: list[str]
    unrecognized: list[str]


def scan(args: list[str], specs: dict[str, FlagSpec], *, underscores_to_dashes: bool = False) -> Scan:
    """Scan `args` (the command line after the program name) against `specs`.

    `underscores_to_dashes`: vLLM's FlexibleArgumentParser accepts `--max_num_seqs` for `--max-num-seqs`.
    Raises OptionError for the first malformed option, as argparse stops at the first one; unknown options
    and the values that follow them are collected instead (argparse reports them all at the end).
    """
    result = Scan(values={}, positionals=[], unrecognized=[])
    index, after_unknown, only_positionals = 0, False, False
    while index < len(args):
        token = args[index]
        index += 1
        if only_positionals or not _looks_like_option(token):
            (result.unrecognized if after_unknown else result.positionals).append(token)
            continue
        if token == "--":
            only_positionals, after_unknown = True, False
            continue
        name, has_inline, inline = token.partition("=")
        if underscores_to_dashes and name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        spec = specs.get(name)
        if spec is None:
            result.unrecognized.append(token)
            after_unknown = True
            continue
        after_unknown = False
        taken: list[str] = [inline] if has_inline else []
        if spec.nargs == "0":
            if has_inline:
                raise OptionError(f"argument {spec.label}: ignored explicit argument {inline!r}")
            negated = name.startswith("--no-") or (name.startswith("--disable-") and spec.dest.startswith("enable_"))
            result.values[spec.dest] = not negated
            continue
        if not has_inline:
            most = 1 if spec.nargs in ("None", "?") else len(args)
            while index < len(args) and len(taken) < most and not _looks_like_option(args[index]):
                taken.append(args[index])
                index += 1
        if spec.nargs == "None" and len(taken) != 1:
            raise OptionError(f"argument {spec.label}: expected one argument")
        if spec.nargs == "+" and not taken:
            raise OptionError(f"argument {spec.label}: expected at least one argument")
        converted = [_convert(spec, text) for text in taken]
        result.values[spec.dest] = converted if spec.nargs in ("+", "*") else (converted[0] if converted else None)
    return result
