"""Hypothesis strategies of hostile SpeculativeDeployment manifests (plain dicts, as sent to the apiserver).

Each document starts from a real file in examples/ and gets a few mutations: a field set to an extreme,
out-of-range, wrong-typed or over-long value, a required field removed, an unknown field added, an array
grown past its limit, and a hostile `metadata.name`. The fields come from the generated CRD schema, so a
field added to the models is attacked without touching this module. An object that keeps unknown fields
(`x-kubernetes-preserve-unknown-fields`: `spec.speculation.extraConfig`) gets free-form JSON: keys the
engine has, keys it has not, keys the operator manages, other spellings, nesting, nulls and too many keys.

Usage::

    @given(hostile_documents())
    def test_it(document: dict[str, Any]) -> None: ...

`huge=False` leaves out the 1 MiB strings and oversized arrays (for loops that must stay fast).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from specdeploy.api.crd import crd
from specdeploy.api.names import MAX_NAME_LENGTH

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
MIB = 2**20

Path_ = tuple[str, ...]
Mutation = Callable[[dict[str, Any]], None]


@cache
def example_documents() -> list[dict[str, Any]]:
    """Every SpeculativeDeployment in examples/ (the GitOps folders hold the same ones); copy before changing."""
    documents = []
    for path in sorted(EXAMPLES_DIR.glob("*.yaml")):
        documents += [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "SpeculativeDeployment"]
    return documents


def spec_schema() -> dict[str, Any]:
    return dict(crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"])


def schema_nodes(node: dict[str, Any], path: Path_ = ("spec",)) -> Iterator[tuple[Path_, dict[str, Any]]]:
    """(path, schema) of every field under `node`, objects included; array items are path + ("[]",)."""
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from schema_nodes(child, (*path, name))
    if "items" in node:
        yield from schema_nodes(node["items"], (*path, "[]"))


SCHEMA_NODES = [(path, node) for path, node in schema_nodes(spec_schema()) if path != ("spec",)]


# --- values ----------------------------------------------------------------------------------------------

UNICODE = "モデル/ünïcødé-🚀‮"  # a right-to-left override included
DURATIONS = ["-5s", "0s", "0", "5", "5 m", "1h30m", "1.5s", "1000000h", "99999999999999999999h", "NaNs", "1d", ""]
QUANTITIES = [0, -80, "-80Gi", "1e3", "80Gi", "0.0001Ki", "1Ei", "80 Gi", 80.5, 10**12, "", "Gi"]
WRONG_TYPES: list[Any] = [None, True, "3", 1.5, [], {}, [1, 2], {"a": 1}]
#: Values of an object that keeps unknown fields (any JSON inside).
FREE_FORM: list[Any] = [
    {"disable_padded_drafter_batch": True},
    {"num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 256, 2]], "parallel_drafting": False},
    {"num_speculative_tokens": 7},                          # managed by the operator (vLLM)
    {"num-speculative-tokens": 7},                          # the same key as vLLM reads it
    {"max_draft_len": 2, "draft_len_schedule": {"4": 2}},  # TensorRT-LLM's keys
    {"tensor_parallel_size": 2},                            # a key vLLM refuses
    {"speculative_model": "x", UNICODE: [None, 1.5, {"deep": {"er": [[]]}}]},
    {"synthetic_acceptance_rates": [0.9, 0.5], "rejection_sample_method": "synthetic", "enforce_eager": None},
    {f"key_{i}": i for i in range(65)},
    {"draft_load_config": {"load_format": "x" * 9000}},    # past the plan's size limit
]


def huge_string(size: int = MIB) -> str:
    return "x" * size


def _integer_values(node: dict[str, Any]) -> list[Any]:
    low, high = node.get("minimum"), node.get("maximum")
    values: list[Any] = [0, -1, 1, 10**6, 2**31, 2**63 - 1, 2**63, -(2**63) - 1]
    if low is not None:
        values += [low - 1, low]
    if high is not None:
        values += [high, high + 1]
    return values


def _number_values(node: dict[str, Any]) -> list[Any]:
    return [0, 0.0, -0.0, -1.0, 1e-300, 1.0, 1.0000001, 1e308, 2, -1e308, 0.5]


def _string_values(node: dict[str, Any], huge: bool) -> list[Any]:
    longest = node.get("maxLength", 64)
    values: list[Any] = ["", " ", UNICODE, "\u0000", "x" * longest, "x" * (longest + 1), "a" * 253, "-" * 3]
    if "enum" in node:
        values += [*node["enum"], node["enum"][0].upper(), node["enum"][0] + " ", "tensorrt-llm", "none"]
    if node.get("pattern", "").endswith("(ms|s|m|h))+$"):
        values += DURATIONS
    if huge:
        values += [huge_string()]
    return values


def values_for(node: dict[str, Any], huge: bool) -> st.SearchStrategy[Any]:
    """Values to put where `node` is expected: boundaries, extremes, wrong types."""
    kind = node.get("type")
    if node.get("x-kubernetes-int-or-string"):
        choices: list[Any] = QUANTITIES
    elif kind == "integer":
        choices = _integer_values(node)
    elif kind == "number":
        choices = _number_values(node)
    elif kind == "string":
        choices = _string_values(node, huge)
    elif kind == "boolean":
        choices = [True, False, "true", 1]
    elif kind == "array":
        choices = [[], ["--x"] * (node.get("maxItems", 8) + 1), [UNICODE]]
    elif node.get("x-kubernetes-preserve-unknown-fields"):
        choices = [{}, {"unknownField": 1}, *FREE_FORM]
    else:
        choices = [{}, {"unknownField": 1}]
    return st.one_of(st.sampled_from(choices), st.sampled_from(WRONG_TYPES))


# --- mutations -------------------------------------------------------------------------------------------

def _parent(document: dict[str, Any], path: Path_, create: bool) -> dict[str, Any] | None:
    """The mapping that holds `path[-1]`; list steps ("[]") take the first item, or make one."""
    node: Any = document
    for step in path[:-1]:
        if step == "[]":
            if not isinstance(node, list):
                return None
            if not node:
                if not create:
                    return None
                node.append({})
            node = node[0]
            continue
        if not isinstance(node, dict):
            return None
        if step not in node:
            if not create:
                return None
            node[step] = {}
        node = node[step]
    return node if isinstance(node, dict) else None


def set_value(path: Path_, value: Any) -> Mutation:
    def mutate(document: dict[str, Any]) -> None:
        if path[-1] == "[]":
            holder = _parent(document, path, create=True)
            if holder is not None:
                holder[path[-2]] = [value] if not isinstance(holder.get(path[-2]), list) else [value, *holder[path[-2]]]
            return
        holder = _parent(document, path, create=True)
        if holder is not None:
            holder[path[-1]] = copy.deepcopy(value)
    mutate.__name__ = f"set {'.'.join(path)}"
    return mutate


def remove(path: Path_) -> Mutation:
    def mutate(document: dict[str, Any]) -> None:
        holder = _parent(document, path, create=False)
        if holder is not None:
            holder.pop(path[-1], None)
    return mutate


def add_unknown(path: Path_, key: str) -> Mutation:
    def mutate(document: dict[str, Any]) -> None:
        holder = _parent(document, (*path, key), create=True)
        if holder is not None:
            holder[key] = "surprise"
    return mutate


@st.composite
def field_mutations(draw: st.DrawFn, huge: bool = True) -> Mutation:
    path, node = draw(st.sampled_from(SCHEMA_NODES))
    action = draw(st.sampled_from(["set", "set", "set", "remove", "unknown"]))
    if action == "remove":
        return remove(path)
    if action == "unknown":
        object_paths = [p for p, n in SCHEMA_NODES if n.get("type") == "object" and p[-1] != "[]"]
        return add_unknown(draw(st.sampled_from([("spec",), *object_paths])),
                           draw(st.sampled_from(["unknownField", "Replicas", "speculative_config", "x-y"])))
    return set_value(path, draw(values_for(node, huge)))


def oversized_arrays() -> st.SearchStrategy[Mutation]:
    """Arrays at and past their maxItems, with the longest items the schema lets through."""
    return st.sampled_from([
        set_value(("spec", "engine", "extraArgs"), ["--enable-prefix-caching"] * 128),
        set_value(("spec", "engine", "extraArgs"), ["--x"] * 129),
        set_value(("spec", "engine", "extraArgs"), [huge_string(MIB)]),
        set_value(("spec", "engine", "extraArgs"), [huge_string(64 * 1024)] * 8),
        set_value(("spec", "engine", "env"), [{"name": f"V{i}", "value": "v"} for i in range(65)]),
        set_value(("spec", "engine", "env"), [{"name": f"V{i}", "value": huge_string(32768)} for i in range(64)]),
        set_value(("spec", "engine", "env"), [{"name": f"V{i}", "value": huge_string(32768)} for i in range(8)]),
        set_value(("spec", "engine", "env"), [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]),
        set_value(("spec", "speculation", "extraConfig"), {f"key_{i}": [i] * 64 for i in range(64)}),
        set_value(("spec", "speculation", "extraConfig"), {f"key_{i}": i for i in range(65)}),
    ])


def names() -> st.SearchStrategy[str]:
    """`metadata.name`s: DNS labels of every length, and what Kubernetes or the operator must refuse."""
    label = st.from_regex(r"[a-z]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
    return st.one_of(
        label, label, label,
        st.sampled_from([
            "a" * MAX_NAME_LENGTH, "a" * (MAX_NAME_LENGTH + 1), "a" * 63, "a" * 64, "a" * 253, "a" * 254,
            "9lives", "a.b", "has.dots.in.it", "UPPER", "trailing-", "-leading", "模型", "caf\u00e9", "",
        ]),
    )


@st.composite
def hostile_documents(draw: st.DrawFn, huge: bool = True) -> dict[str, Any]:
    """An example with 0 to 3 mutations and a drawn name; about one in six is left valid."""
    document = copy.deepcopy(draw(st.sampled_from(example_documents())))
    document["metadata"] = {"name": draw(names())}
    mutations = field_mutations(huge)
    if huge:
        mutations = st.one_of(mutations, mutations, mutations, oversized_arrays())
    for mutate in draw(st.lists(mutations, max_size=3)):
        mutate(document)
    return document


#: The cases the issue names, always run: (label, document).
def named_cases() -> list[tuple[str, dict[str, Any]]]:
    base = copy.deepcopy(next(d for d in example_documents() if d["metadata"]["name"] == "llama-8b-ngram"))

    def case(label: str, name: str, *mutations: Mutation) -> tuple[str, dict[str, Any]]:
        document = copy.deepcopy(base)
        document["metadata"] = {"name": name}
        for mutate in mutations:
            mutate(document)
        return label, document

    return [
        case("valid", "valid"),
        case("zero GPUs", "zero-gpus", set_value(("spec", "resources", "gpu", "count"), 0)),
        case("zero GPU memory", "zero-gpu-memory", set_value(("spec", "resources", "gpu", "memoryGiB"), 0)),
        case("a million replicas", "million-replicas", set_value(("spec", "replicas"), 10**6)),
        case("the most replicas", "most-replicas", set_value(("spec", "replicas"), 10_000)),
        case("negative interval", "negative-interval", set_value(("spec", "analysis", "interval"), "-5s")),
        case("negative window", "negative-window", set_value(("spec", "analysis", "window"), -300)),
        case("unicode name", "模型"),
        case("253-character name", "a" * 253),
        case("longest name", "a" * MAX_NAME_LENGTH),
        case("name with dots", "a.b"),
        case("name with a leading digit", "9lives"),
        case("1 MiB model name", "huge-model-name", set_value(("spec", "model", "name"), huge_string())),
        case("1 MiB extra argument", "huge-extra-arg", set_value(("spec", "engine", "extraArgs"), [huge_string()])),
        case("256 KiB of environment", "huge-env", set_value(
            ("spec", "engine", "env"), [{"name": f"V{i}", "value": huge_string(32768)} for i in range(8)])),
        case("unknown engine", "unknown-engine", set_value(("spec", "engine", "kind"), "tensorrt-llm")),
        case("unknown model", "unknown-model", set_value(("spec", "model", "name"), "acme/NoSuchModel-7B")),
        case("unicode model", "unicode-model", set_value(("spec", "model", "name"), UNICODE)),
        case("no speculation", "no-speculation", remove(("spec", "speculation"))),
        case("unknown field", "unknown-field", add_unknown(("spec",), "speculative_config")),
        case("extra speculative config", "extra-config", set_value(
            ("spec", "speculation", "extraConfig"),
            {"disable_padded_drafter_batch": True, "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 256, 2]]})),
        case("managed extra config key", "managed-extra-config",
             set_value(("spec", "speculation", "extraConfig"), {"num_speculative_tokens": 7})),
        case("unknown extra config key", "unknown-extra-config",
             set_value(("spec", "speculation", "extraConfig"), {"speculative_model": "x"})),
        case("65 extra config keys", "many-extra-config",
             set_value(("spec", "speculation", "extraConfig"), {f"key_{i}": i for i in range(65)})),
        case("4 MiB request", "huge-request", set_value(("spec", "notes"), huge_string(4 * MIB))),
    ]
