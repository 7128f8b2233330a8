"""Engine flags the operator sets itself, and the vLLM flags that no longer exist.

`spec.engine.extraArgs` is for tuning the operator does not model. A flag that the operator renders from
a spec field must not be set there too: the engine would see it twice (argparse keeps the last value,
click refuses), and the memory plan would describe a pod that does not exist.

Each engine's tables (flag -> the spec field that owns it, with the engines' sources) are in its profile
(`EngineProfile.managed_flags`, engines/vllm.py, sglang.py, trtllm.py); this module reads a command line with them.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdeploy.api.spec import EngineKind
from specdeploy.engines import engine_profile

MANAGED_FLAGS: dict[EngineKind, dict[str, str]] = {
    kind: dict(engine_profile(kind).managed_flags.owned) for kind in EngineKind
}
"""Per engine: flag → the spec field that sets it (a `spec.` path), or why the operator sets it itself.
Exact spellings, aliases listed."""

_SHORTEST_ABBREVIATION = 4  # "--tp": shorter prefixes are ambiguous in every engine's flag set


@dataclass(frozen=True)
class FlagUse:
    """One flag found in extraArgs: where, as written, and what it is."""

    position: int       # index in spec.engine.extraArgs
    written: str        # the flag as the user wrote it (without any =value)
    flag: str           # the engine's own spelling that it resolves to
    owner: str          # spec field path, or why the operator sets it; "" for a removed flag
    replacement: str    # for a removed vLLM flag: what replaced it; "" otherwise


def flag_name(engine: EngineKind, argument: str) -> str | None:
    """The flag an argument sets, normalised as the engine's parser sees it; None for a value.

    `--flag=value` counts as `--flag`, spelled as the engine's parser reads it (`ManagedFlags.spelling`).
    """
    if not argument.startswith("-") or argument == "-" or _is_number(argument):
        return None
    return engine_profile(engine).managed_flags.spelling(argument.split("=", 1)[0])


def _is_number(argument: str) -> bool:
    try:
        float(argument)
    except ValueError:
        return False
    return True


def _expansions(engine: EngineKind, name: str, table: dict[str, str]) -> list[str]:
    """The table flags `name` can mean: itself, or those it abbreviates (engines that parse with argparse, whose
    allow_abbrev accepts any unambiguous prefix of a long flag; click does not)."""
    if name in table:
        return [name]
    if not engine_profile(engine).managed_flags.abbreviations:
        return []
    if name.startswith("--"):
        if len(name) < _SHORTEST_ABBREVIATION:
            return []
        return sorted(flag for flag in table if flag.startswith(name))
    # argparse takes a one-letter short option's value glued on: "-qfp8" is "-q fp8".
    return [flag for flag in table if len(flag) == 2 and name.startswith(flag)]


def classify_flag(engine: EngineKind, name: str) -> tuple[str, str, str] | None:
    """(engine flag, owner, replacement) for a managed or removed flag `name`; None for a free flag.

    An abbreviation that could mean two managed flags with different owners is left alone: the engine
    refuses it as ambiguous before it could override anything.
    """
    tables = engine_profile(engine).managed_flags
    if name in tables.removed:
        # Exact names only: a removed flag has no abbreviations left in today's parser.
        return name, "", tables.removed[name]
    managed = MANAGED_FLAGS[engine]
    flags = _expansions(engine, name, managed)
    if flags and len({managed[flag] for flag in flags}) == 1:
        return flags[0], managed[flags[0]], ""
    for prefix, owner in tables.owned_prefixes.items():
        if name.startswith(prefix):
            return name, owner, ""
    for prefix, replacement in tables.removed_prefixes.items():
        if name.startswith(prefix):
            return name, "", replacement
    return None


def find_managed_flags(engine: EngineKind, extra_args: list[str]) -> list[FlagUse]:
    """Every argument in `extra_args` that sets a flag the operator manages or the engine removed, in order."""
    found: list[FlagUse] = []
    for index, argument in enumerate(extra_args):
        name = flag_name(engine, argument)
        if name is None:
            continue
        classified = classify_flag(engine, name)
        if classified is not None:
            flag, owner, replacement = classified
            found.append(FlagUse(index, argument.split("=", 1)[0], flag, owner, replacement))
    return found
