#!/usr/bin/env python3
"""Extract an inference engine's real CLI flag inventory into tests/data/engine-flags/<engine>.json.

The renderers in operator/specdeploy/engines/ write command lines for engines this repository does not
install. This script installs one engine version into a throwaway virtualenv, builds the engine's own
argparse parser there and writes down every flag: its spellings, whether it takes a value, nargs, the
choices, and a type class found by feeding the engine's own type callable probe strings. The unit test
tests/unit/test_engine_flags.py checks every rendered command against that file, without the engine.

Run by a developer when an engine version changes, never by the test suite (it downloads GBs of wheels):

    python scripts/engine-flag-inventory.py --engine vllm --version 0.33.0 \
        --out tests/data/engine-flags/vllm.json
    python scripts/engine-flag-inventory.py --engine sglang --version 0.5.23 \
        --out tests/data/engine-flags/sglang.json

`--python PATH` reuses a virtualenv that already has the engine installed instead of creating one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

# Runs inside the engine's virtualenv: builds the engine's parser and prints the inventory as JSON.
# It only imports the engine's argument modules, so it works on a machine without GPUs.
EXTRACTOR = r'''
import argparse, dataclasses, json, sys, typing, importlib.metadata as md

ENGINE = sys.argv[1]
PROBES = {"int": "7", "float": "0.5", "word": "abc", "json": '{"k": 1}'}


def type_name(fn):
    if fn is None:
        return "str"
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return name


def probe(fn):
    """Which probe strings the flag's own type callable accepts."""
    accepted = {}
    for label, text in PROBES.items():
        try:
            fn(text)
            accepted[label] = True
        except Exception:
            accepted[label] = False
    return accepted


def value_class(fn, accepted):
    """int, float, json, str, or callable: what values the engine accepts, decided by behaviour."""
    if fn is None or all(accepted.values()):
        return "str"
    if accepted["int"] and not accepted["float"] and not accepted["word"]:
        return "int"
    if accepted["int"] and accepted["float"] and not accepted["word"] and not accepted["json"]:
        return "float"
    if accepted["json"] and not accepted["word"]:
        return "json"
    return "callable"


def describe(action):
    takes_value = action.nargs != 0 and not isinstance(
        action, (argparse._StoreConstAction, argparse._CountAction, argparse._HelpAction,
                 argparse._VersionAction, argparse.BooleanOptionalAction))
    if isinstance(action, argparse.BooleanOptionalAction):
        takes_value = False
    entry = {
        "dest": action.dest,
        "takes_value": takes_value,
        "nargs": action.nargs if isinstance(action.nargs, (int, str)) or action.nargs is None else str(action.nargs),
        "choices": sorted(str(c) for c in action.choices) if action.choices is not None else None,
        "type": type_name(action.type) if takes_value else "flag",
        "deprecated": bool(getattr(action, "deprecated", False))
        or "deprecated" in (action.help or "").lower()[:200],
    }
    if takes_value:
        fn = action.type
        accepted = probe(fn) if fn is not None else {k: True for k in PROBES}
        entry["value"] = value_class(fn, accepted)
    return entry


def flatten_literal(tp):
    """All string values of a (possibly nested) typing.Literal / Union."""
    out = []
    for arg in typing.get_args(tp):
        if isinstance(arg, str):
            out.append(arg)
        else:
            out.extend(flatten_literal(arg))
    return out


def inventory(parser):
    flags, positionals = {}, []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if not action.option_strings:
            positionals.append(action.dest)
            continue
        entry = describe(action)
        entry["aliases"] = sorted(action.option_strings)
        for spelling in action.option_strings:
            flags[spelling] = entry
    return flags, positionals


if ENGINE == "vllm":
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
        parser_source = "vllm.entrypoints.common.cli_args.make_arg_parser"
    except ImportError:  # older layouts
        from vllm.entrypoints.openai.cli_args import make_arg_parser
        parser_source = "vllm.entrypoints.openai.cli_args.make_arg_parser"
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    flags, positionals = inventory(parser)
    from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
    from vllm.config.cache import CacheDType
    extra = {
        "speculative_config": {
            "source": "vllm.config.speculative.SpeculativeConfig",
            "fields": sorted(f.name for f in dataclasses.fields(SpeculativeConfig)),
            "method": sorted(set(flatten_literal(SpeculativeMethod))),
        },
        # --quantization and --kv-cache-dtype are typed str in the parser; these are the values vLLM accepts.
        "quantization_methods": sorted(QUANTIZATION_METHODS),
        "kv_cache_dtypes": sorted(set(flatten_literal(CacheDType))),
    }
    command = ["vllm", "serve"]
elif ENGINE == "sglang":
    from sglang.srt.server_args import ServerArgs
    parser = argparse.ArgumentParser(prog="python3 -m sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    parser_source = "sglang.srt.server_args.ServerArgs.add_cli_args"
    flags, positionals = inventory(parser)
    # --speculative-algorithm is a free string (plugins may register more); the builtins are the
    # SpeculativeAlgorithm members plus the names its help text lists (NEXTN is an alias of EAGLE).
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    import re
    help_text = next(a.help for a in parser._actions if "--speculative-algorithm" in a.option_strings)
    listed = re.search(r"Builtins: ([A-Z0-9_, ]+)", help_text or "")
    names = set(SpeculativeAlgorithm.__members__) - {"NONE"}
    names |= {n.strip() for n in listed.group(1).split(",")} if listed else set()
    extra = {"speculative_algorithms": sorted(names)}
    command = ["python3", "-m", "sglang.launch_server"]
else:
    raise SystemExit(f"unknown engine {ENGINE!r}")

print(json.dumps({
    "engine": ENGINE,
    "version": md.version(ENGINE),
    "python": sys.version.split()[0],
    "extracted_from": parser_source + " (the engine's own argparse parser, imported)",
    "extracted_by": "scripts/engine-flag-inventory.py",
    "command": command,
    "positionals": positionals,
    "flags": dict(sorted(flags.items())),
    **extra,
}, indent=1, sort_keys=False))
'''


def engine_python(engine: str, version: str, reuse: str | None) -> Path:
    """A python interpreter with `engine==version` installed (a fresh throwaway venv unless reused)."""
    if reuse:
        return Path(reuse)
    where = Path(tempfile.gettempdir()) / f"specdeploy-flag-inventory-{engine}-{version}"
    python = where / "bin" / "python"
    if not python.exists():
        venv.create(where, with_pip=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    subprocess.run([python, "-m", "pip", "install", "--quiet", f"{engine}=={version}"], check=True)
    return python


def render_inventory(inventory: dict) -> str:
    """The inventory as JSON with one flag per line, so that a version bump diffs flag by flag."""
    head = {k: v for k, v in inventory.items() if k != "flags"}
    lines = [json.dumps(head, indent=1)[:-2] + ",", ' "flags": {']
    items = sorted(inventory["flags"].items())
    for i, (name, entry) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        lines.append(f"  {json.dumps(name)}: {json.dumps(entry, sort_keys=True)}{comma}")
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def extraction_env() -> dict[str, str]:
    """The environment of the extractor: vLLM told it runs on CPU, so that building its parser does not
    fail on a machine without a GPU (DeviceConfig asks the platform for a device type). Flags and their
    choices do not depend on the platform; only defaults would, and the inventory records none."""
    return {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=["vllm", "sglang"], required=True)
    parser.add_argument("--version", required=True, help="engine version on PyPI, e.g. 0.33.0")
    parser.add_argument("--out", type=Path, required=True, help="where to write the inventory JSON")
    parser.add_argument("--python", help="interpreter of a virtualenv that already has the engine")
    args = parser.parse_args()

    python = engine_python(args.engine, args.version, args.python)
    result = subprocess.run(
        [python, "-c", EXTRACTOR, args.engine], capture_output=True, text=True, env=extraction_env()
    )
    if result.returncode != 0:
        print(result.stderr, file=sys.stderr)
        print(f"extracting the {args.engine} parser failed (exit {result.returncode})", file=sys.stderr)
        return 1
    inventory = json.loads(result.stdout)
    if inventory["version"] != args.version:
        print(f"installed {args.engine} is {inventory['version']}, not {args.version}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render_inventory(inventory))
    print(f"{args.out}: {len(inventory['flags'])} flag spellings of {args.engine} {inventory['version']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
