"""Small local stand-ins for the models an SD names, with real weights whose acceptance is known by construction.

Why: the dev cluster runs vLLM's CPU build but cannot download a model, and a test of the operator needs a
target/draft pair whose acceptance it can choose. Every stand-in shares one word-level tokenizer over
``w0 … w511`` (so target and draft vocabularies match) and is a Llama whose layers add nothing (``o_proj``
and ``down_proj`` are zero, so the residual stream stays the token's embedding). Its ``lm_head`` row for
word ``y`` is the embedding of the word that ``y`` follows, so the model continues any text deterministically
with its successor map:

* the target follows a fixed permutation π that keeps each half of the words to itself: one cycle through
  ``w0 … w255`` (the *predictable* half), one through ``w256 … w511`` (the *unpredictable* half);
* a draft has the same embeddings and one layer; it follows π on a chosen fraction ``agreement`` of the
  predictable half (spread evenly along π's cycle) and never on the unpredictable half.

So a prompt ending in a predictable word is drafted right about ``agreement`` of the time and one ending in
an unpredictable word never; a traffic mix gives any acceptance in between. vLLM's ``ngram`` method needs no
draft (it looks the continuation up in the prompt and output of the target). Everything is generated with
numpy, ``safetensors.numpy`` and ``tokenizers`` (no torch), once, under ``<cache>/standins/<name>/``.

Usage::

    target = ensure_standin("target", "target", progress=print)
    draft = ensure_standin("draft", "draft", agreement=1.0)
    prompt = " ".join(prompt_words(PREDICTABLE, length=8, seed=1))
    ngram_prompt = " ".join(repeating_prompt_words(PREDICTABLE, length=30, seed=1))
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from specdeploy.paths import cache_dir

Progress = Callable[[str], None]
Kind = Literal["target", "draft"]
Half = Literal["predictable", "unpredictable"]
PREDICTABLE: Half = "predictable"
UNPREDICTABLE: Half = "unpredictable"

#: Bumped whenever the construction below changes, so cached stand-ins are regenerated.
CONSTRUCTION_VERSION = 1

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
SPECIAL_TOKENS: tuple[str, ...] = (UNK, BOS, EOS)
WORD_COUNT = 512
WORDS: tuple[str, ...] = tuple(f"w{i}" for i in range(WORD_COUNT))
VOCABULARY: tuple[str, ...] = SPECIAL_TOKENS + WORDS
FIRST_WORD_ID = len(SPECIAL_TOKENS)

HIDDEN_SIZE = 256
HEAD_DIM = 64  # vLLM's CPU attention refuses head_dim 16 ("Unsupported CPU attention configuration")
NUM_HEADS = HIDDEN_SIZE // HEAD_DIM
INTERMEDIATE_SIZE = 512
MAX_POSITIONS = 2048
TARGET_LAYERS = 2
DRAFT_LAYERS = 1
#: The logit of the successor; every other word's is at most about 0.25 of it (random embeddings in 256
#: dimensions), so 30 makes the stand-ins near-deterministic at temperature 1. Smaller: acceptance falls with
#: temperature.
DEFAULT_LOGIT_SCALE = 30.0
#: Seeds the embeddings and π: every stand-in with the same seed shares them.
DEFAULT_SEED = 12


@dataclass(frozen=True)
class StandinSpec:
    """What a stand-in is made of; its JSON is the stamp that says a cached copy is complete and current."""

    kind: Kind
    agreement: float
    logit_scale: float
    seed: int
    construction: int = CONSTRUCTION_VERSION

    @property
    def layers(self) -> int:
        return TARGET_LAYERS if self.kind == "target" else DRAFT_LAYERS


def token_id(token: str) -> int:
    """The id of a word (``w<i>``) or special token in the shared vocabulary."""
    return VOCABULARY.index(token)


def half_words(half: Half) -> tuple[str, ...]:
    """The 256 words of one half: the target's successor of each is in the same half."""
    middle = WORD_COUNT // 2
    return WORDS[:middle] if half == PREDICTABLE else WORDS[middle:]


def target_cycle(half: Half, seed: int = DEFAULT_SEED) -> tuple[int, ...]:
    """The token ids of one half in the order the target walks them (π is this cycle, closed)."""
    ids = np.array([token_id(w) for w in half_words(half)])
    offset = 0 if half == PREDICTABLE else 1
    return tuple(int(i) for i in np.random.default_rng([seed, offset]).permutation(ids))


def target_successors(seed: int = DEFAULT_SEED) -> dict[int, int]:
    """π: word id -> the word id the target writes after it."""
    successors: dict[int, int] = {}
    for half in (PREDICTABLE, UNPREDICTABLE):
        cycle = target_cycle(half, seed)
        successors.update({cycle[i]: cycle[(i + 1) % len(cycle)] for i in range(len(cycle))})
    return successors


def agreed_ids(agreement: float, seed: int = DEFAULT_SEED) -> frozenset[int]:
    """The predictable words whose successor the draft gets right: ``floor(agreement × 256)`` of them,
    spread evenly along π's cycle so acceptance is steady, not bursty."""
    if not 0.0 <= agreement <= 1.0:
        raise ValueError(f"agreement must be between 0 and 1, got {agreement!r}")
    cycle = target_cycle(PREDICTABLE, seed)
    return frozenset(word for step, word in enumerate(cycle)
                     if math.floor((step + 1) * agreement) > math.floor(step * agreement))


def draft_successors(agreement: float, seed: int = DEFAULT_SEED) -> dict[int, int]:
    """The draft's successor map: π on the agreed words; on every other word, π of another disagreeing
    word (a one-step rotation of them), so the map stays a permutation and is wrong exactly there."""
    target = target_successors(seed)
    agreed = agreed_ids(agreement, seed)
    disagreed = sorted(set(target) - agreed)
    successors = {word: target[word] for word in agreed}
    successors.update({word: target[disagreed[(i + 1) % len(disagreed)]] for i, word in enumerate(disagreed)})
    return successors


def successors_for(spec: StandinSpec) -> dict[int, int]:
    return target_successors(spec.seed) if spec.kind == "target" else draft_successors(spec.agreement, spec.seed)


def model_config(layers: int) -> dict[str, object]:
    """config.json of a Llama-shaped stand-in with `layers` decoder layers."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": len(VOCABULARY),
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": layers,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": token_id(BOS),
        "eos_token_id": token_id(EOS),
        "torch_dtype": "float32",
    }


def embeddings(seed: int = DEFAULT_SEED) -> np.ndarray:
    """One random unit-RMS row per token, shared by every stand-in of this seed."""
    return np.random.default_rng([seed, 2]).standard_normal((len(VOCABULARY), HIDDEN_SIZE)).astype(np.float32)


def lm_head(embedding: np.ndarray, successors: dict[int, int], logit_scale: float) -> np.ndarray:
    """Row `successors[x]` is x's embedding, scaled so that after the final RMSNorm its logit is `logit_scale`
    (the norm gives the hidden state length sqrt(hidden)). Special tokens' rows stay zero."""
    head = np.zeros_like(embedding)
    for word, successor in successors.items():
        row = embedding[word]
        head[successor] = row / np.linalg.norm(row) * (logit_scale / math.sqrt(HIDDEN_SIZE))
    return head


def model_tensors(spec: StandinSpec) -> dict[str, np.ndarray]:
    """Every weight of the stand-in, named as transformers' LlamaForCausalLM names them."""
    rng = np.random.default_rng([spec.seed, 3, spec.layers])
    embedding = embeddings(spec.seed)

    def small(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)

    ones = np.ones(HIDDEN_SIZE, dtype=np.float32)
    tensors = {
        "model.embed_tokens.weight": embedding,
        "model.norm.weight": ones,
        "lm_head.weight": lm_head(embedding, successors_for(spec), spec.logit_scale),
    }
    for layer in range(spec.layers):
        prefix = f"model.layers.{layer}"
        tensors |= {
            f"{prefix}.input_layernorm.weight": ones,
            f"{prefix}.post_attention_layernorm.weight": ones,
            f"{prefix}.self_attn.q_proj.weight": small(HIDDEN_SIZE, HIDDEN_SIZE),
            f"{prefix}.self_attn.k_proj.weight": small(HIDDEN_SIZE, HIDDEN_SIZE),
            f"{prefix}.self_attn.v_proj.weight": small(HIDDEN_SIZE, HIDDEN_SIZE),
            f"{prefix}.self_attn.o_proj.weight": np.zeros((HIDDEN_SIZE, HIDDEN_SIZE), dtype=np.float32),
            f"{prefix}.mlp.gate_proj.weight": small(INTERMEDIATE_SIZE, HIDDEN_SIZE),
            f"{prefix}.mlp.up_proj.weight": small(INTERMEDIATE_SIZE, HIDDEN_SIZE),
            f"{prefix}.mlp.down_proj.weight": np.zeros((HIDDEN_SIZE, INTERMEDIATE_SIZE), dtype=np.float32),
        }
    return tensors


def greedy_successors(tensors: dict[str, np.ndarray]) -> np.ndarray:
    """What the stand-in writes after each token, computed from its weights: argmax of lm_head · RMSNorm(embedding)
    (exact because the layers add nothing)."""
    embedding = tensors["model.embed_tokens.weight"]
    normed = embedding / np.sqrt(np.mean(embedding**2, axis=1, keepdims=True) + 1e-6) * tensors["model.norm.weight"]
    result: np.ndarray = np.argmax(normed @ tensors["lm_head.weight"].T, axis=1)
    return result


def tokenizer() -> Tokenizer:
    """The shared word-level tokenizer: whitespace-separated words in, words joined by spaces out."""
    tok = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(VOCABULARY)}, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def tokenizer_config() -> dict[str, object]:
    """tokenizer_config.json: transformers' fast tokenizer over tokenizer.json, no BOS added to prompts."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
    }


def prompt_words(half: Half, length: int, seed: int) -> list[str]:
    """`length` words drawn (with a seeded RNG) from one half: a prompt whose continuation the draft predicts
    (PREDICTABLE, with agreement 1) or never predicts (UNPREDICTABLE)."""
    pool = half_words(half)
    rng = np.random.default_rng(seed)
    return [pool[int(i)] for i in rng.integers(0, len(pool), size=length)]


def repeating_prompt_words(half: Half, length: int, seed: int) -> list[str]:
    """A prompt for vLLM's ``ngram`` method: `length` words along the target's own cycle from a seeded start,
    then its first two again, so prompt lookup finds the continuation the target writes (prompts of random
    words give ngram nothing to propose: the target repeats itself only after 256 words)."""
    cycle = target_cycle(half)
    start = int(np.random.default_rng(seed).integers(0, len(cycle)))
    walk = [VOCABULARY[cycle[(start + step) % len(cycle)]] for step in range(length)]
    return walk + walk[:2]


def standins_dir() -> Path:
    """Where generated stand-ins live: ``<cache>/standins``."""
    return cache_dir() / "standins"


def write_standin(spec: StandinSpec, directory: Path) -> None:
    """Write config, tokenizer and weights of `spec` into `directory` (which must exist)."""
    write = {
        "config.json": model_config(spec.layers),
        "generation_config.json": {"bos_token_id": token_id(BOS), "eos_token_id": token_id(EOS)},
        "tokenizer_config.json": tokenizer_config(),
        "special_tokens_map.json": {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK},
    }
    for name, content in write.items():
        (directory / name).write_text(json.dumps(content, indent=2) + "\n")
    tokenizer().save(str(directory / "tokenizer.json"))
    save_file(model_tensors(spec), str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "standin.json").write_text(json.dumps(asdict(spec), sort_keys=True) + "\n")


def ensure_standin(name: str, kind: Kind, *, agreement: float = 1.0, logit_scale: float = DEFAULT_LOGIT_SCALE,
                   seed: int = DEFAULT_SEED, root: Path | None = None, progress: Progress | None = None) -> Path:
    """The directory of stand-in `name` (a Hugging Face model vLLM loads from a local path), generated once.

    `agreement` is used by drafts only: the fraction of the predictable half whose successor the draft gets
    right. A cached copy with other parameters is regenerated; writing goes to a temporary sibling renamed into
    place, so a directory that exists is complete.
    """
    spec = StandinSpec(kind=kind, agreement=agreement if kind == "draft" else 1.0, logit_scale=logit_scale, seed=seed)
    if kind == "draft":
        agreed_ids(agreement, seed)  # validates before anything is written
    base = root or standins_dir()
    directory = base / name
    stamp = directory / "standin.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == asdict(spec):
        return directory
    if progress:
        progress(f"  generating stand-in {name} ({kind}, {spec.layers} layers) -> {directory}")
    base.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=base))
    partial.chmod(0o755)
    try:
        write_standin(spec, partial)
        shutil.rmtree(directory, ignore_errors=True)
        partial.replace(directory)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return directory
