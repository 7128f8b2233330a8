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
draft (it looks the continuation up in the prompt and output of the target).

EAGLE heads for the stand-in target follow the same successor map as a draft of the same ``agreement`` (σ,
``draft_successors``), by what vLLM 0.32's loaders compute (facts from its source, files named at each head):

* ``eagle`` (EagleLlamaForCausalLM, vllm/model_executor/models/llama_eagle.py): ``fc([embed(token), hidden])``,
  one decoder layer without input norm, no final norm, then the *target's* ``lm_head`` (the head has none of its
  own). Here ``fc`` keeps the embedding half and drops the target's hidden state, the layer adds nothing, and
  the head's own ``embed_tokens`` row of word ``x`` is the (unit-RMS) target embedding of ``π⁻¹(σ(x))``, so the
  target's ``lm_head`` reads ``σ(x)``: exact.
* ``eagle3`` (Eagle3LlamaForCausalLM, vllm/model_executor/models/llama_eagle3.py): ``fc`` over three of the
  target's layer outputs, one decoder layer whose attention reads ``[norm(embed(token)), hidden_norm(hidden)]``,
  final norm, its *own* ``lm_head`` over a reduced draft vocabulary (the 512 words; ``d2t`` maps back to target
  ids). The token reaches the residual stream only through attention, so ``hidden_norm`` is zero (with
  ``norm_before_residual`` the residual starts at zero), q and k are the token's embedding (each position
  attends to itself with a score far above every other word's, and positions holding the same word carry the
  same value), v and ``o_proj`` copy it, the MLP adds nothing, and ``lm_head``'s row of ``σ(x)`` is x's
  embedding: exact up to the softmax weight left on other words (their scores are at least 25 below a
  position's own, ``attention_margin``: under 2048·e⁻²⁵ of the weight at the longest context).

Everything is generated with numpy, ``safetensors.numpy`` and ``tokenizers`` (no torch), once, under
``<cache>/standins/<name>/``.

Usage::

    target = ensure_standin("target", "target", progress=print)
    draft = ensure_standin("draft", "draft", agreement=1.0)
    eagle3 = ensure_standin("eagle3", "eagle3", agreement=1.0)   # also "eagle"
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
Kind = Literal["target", "draft", "eagle", "eagle3"]
#: The kinds that speculate for the target: their successor map is draft_successors(agreement).
SPECULATOR_KINDS: tuple[Kind, ...] = ("draft", "eagle", "eagle3")
#: vLLM's speculative methods that load an EAGLE head, and the stand-in kind each gets.
HEAD_KINDS: dict[str, Kind] = {"eagle": "eagle", "eagle3": "eagle3"}
Half = Literal["predictable", "unpredictable"]
PREDICTABLE: Half = "predictable"
UNPREDICTABLE: Half = "unpredictable"

#: Bumped whenever the construction below changes, so cached stand-ins are regenerated.
CONSTRUCTION_VERSION = 2

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
#: An EAGLE head's decoder layers (one, as in the published heads).
HEAD_LAYERS = 1
#: The target layers whose outputs an EAGLE-3 head reads (vLLM's default, (2, layers // 2, layers - 3) in
#: vllm/model_executor/models/interfaces.py, names a layer a two-layer target lacks): 0 is the embeddings.
EAGLE3_AUX_LAYERS: tuple[int, ...] = (0, 1, 2)
#: An EAGLE-3 head drafts from the words only (draft_vocab_size); d2t adds FIRST_WORD_ID back.
EAGLE3_DRAFT_VOCAB = WORD_COUNT
#: The EAGLE-3 head's query scale: a position's score on itself is about 8 × this (64 dims of a unit-RMS
#: embedding, divided by sqrt(head_dim)); on another word about N(0, this²).
EAGLE3_QUERY_SCALE = 12.0
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
        return {"target": TARGET_LAYERS, "draft": DRAFT_LAYERS}.get(self.kind, HEAD_LAYERS)


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


def predecessors(successors: dict[int, int]) -> dict[int, int]:
    """The inverse of a successor map (each is a permutation of the words)."""
    return {nxt: word for word, nxt in successors.items()}


def model_config(layers: int) -> dict[str, object]:
    """config.json of a Llama-shaped stand-in with `layers` decoder layers (a target or a draft)."""
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


def head_config(kind: Kind) -> dict[str, object]:
    """config.json of an EAGLE head. vLLM's EAGLEConfig (vllm/transformers_utils/configs/eagle.py) turns the
    architecture into the head's class: ``LlamaForCausalLM`` becomes ``EagleLlamaForCausalLM`` for method eagle;
    ``LlamaForCausalLMEagle3`` (the EAGLE authors' name, as the published EAGLE-3 heads write it) is kept and
    registered as Eagle3LlamaForCausalLM (vllm/model_executor/models/registry.py)."""
    config = model_config(HEAD_LAYERS)
    if kind == "eagle":
        return config
    if kind != "eagle3":
        raise ValueError(f"not an EAGLE head kind: {kind!r}")
    return config | {
        "architectures": ["LlamaForCausalLMEagle3"],
        "draft_vocab_size": EAGLE3_DRAFT_VOCAB,
        "target_hidden_size": HIDDEN_SIZE,
        "eagle_aux_hidden_state_layer_ids": list(EAGLE3_AUX_LAYERS),
        "norm_before_residual": True,  # the residual starts as hidden_norm(hidden), zero here
    }


def config_for(spec: StandinSpec) -> dict[str, object]:
    """config.json of `spec`."""
    return head_config(spec.kind) if spec.kind in HEAD_KINDS.values() else model_config(spec.layers)


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


def unit_rms(rows: np.ndarray) -> np.ndarray:
    """Each row scaled to root-mean-square 1 (what an RMSNorm with unit weight makes of it, without the eps)."""
    result: np.ndarray = (rows / np.sqrt(np.mean(rows**2, axis=-1, keepdims=True))).astype(np.float32)
    return result


def model_tensors(spec: StandinSpec) -> dict[str, np.ndarray]:
    """Every weight of the stand-in: a target or draft named as transformers' LlamaForCausalLM names them, an
    EAGLE head as the published heads name theirs (eagle_tensors, eagle3_tensors)."""
    if spec.kind == "eagle":
        return eagle_tensors(spec)
    if spec.kind == "eagle3":
        return eagle3_tensors(spec)
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


def _small_weights(spec: StandinSpec) -> Callable[[int, int], np.ndarray]:
    """Small random matrices for the weights whose value does not matter (their products are zeroed later)."""
    rng = np.random.default_rng([spec.seed, 4, SPECULATOR_KINDS.index(spec.kind)])

    def small(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)

    return small


def eagle_tensors(spec: StandinSpec) -> dict[str, np.ndarray]:
    """An EAGLE-1 head, named as vLLM's EagleLlamaForCausalLM.load_weights reads them (it prefixes ``model.``
    to every name but ``lm_head``; llama_eagle.py): ``embed_tokens``, ``fc`` (hidden × 2·hidden, over
    [embedding, target hidden state]) and ``layers.0`` without ``input_layernorm`` (vLLM replaces it with the
    identity). No ``norm`` (the head has none) and no ``lm_head`` (vLLM gives it the target's).

    ``fc`` = [I, 0] keeps the token's embedding; ``o_proj`` and ``down_proj`` are zero, so the head's output is
    its own embedding of the token, which the target's ``lm_head`` reads as the word after π⁻¹ of it. Row x of
    that embedding is the unit-RMS target embedding of π⁻¹(σ(x)): the head writes σ(x)."""
    target = target_successors(spec.seed)
    before = predecessors(target)
    draft = draft_successors(spec.agreement, spec.seed)
    embedding = embeddings(spec.seed)
    own = unit_rms(embedding)
    for word, successor in draft.items():
        own[word] = unit_rms(embedding[before[successor]])
    identity = np.eye(HIDDEN_SIZE, dtype=np.float32)
    ones = np.ones(HIDDEN_SIZE, dtype=np.float32)
    small = _small_weights(spec)
    return {
        "embed_tokens.weight": own,
        "fc.weight": np.concatenate([identity, np.zeros_like(identity)], axis=1),
        "layers.0.post_attention_layernorm.weight": ones,
        "layers.0.self_attn.q_proj.weight": small(HIDDEN_SIZE, HIDDEN_SIZE),
        "layers.0.self_attn.k_proj.weight": small(HIDDEN_SIZE, HIDDEN_SIZE),
        "layers.0.self_attn.v_proj.weight": small(HIDDEN_SIZE, HIDDEN_SIZE),
        "layers.0.self_attn.o_proj.weight": np.zeros((HIDDEN_SIZE, HIDDEN_SIZE), dtype=np.float32),
        "layers.0.mlp.gate_proj.weight": small(INTERMEDIATE_SIZE, HIDDEN_SIZE),
        "layers.0.mlp.up_proj.weight": small(INTERMEDIATE_SIZE, HIDDEN_SIZE),
        "layers.0.mlp.down_proj.weight": np.zeros((HIDDEN_SIZE, INTERMEDIATE_SIZE), dtype=np.float32),
    }


def eagle3_tensors(spec: StandinSpec) -> dict[str, np.ndarray]:
    """An EAGLE-3 head, named as the published heads name theirs and vLLM's Eagle3LlamaForCausalLM loads them
    (llama_eagle3.py: ``midlayer.`` is its ``layers.0.``, ``d2t`` its draft_id_to_target_id, ``t2d`` skipped):
    ``fc`` (hidden × 3·hidden, zero), ``midlayer`` (q, k, v over [embedding, hidden], 2·hidden wide;
    ``hidden_norm`` zero), ``norm``, its own ``lm_head`` over the EAGLE3_DRAFT_VOCAB words, ``d2t``, ``t2d``.
    No ``embed_tokens``: vLLM shares the target's.

    q = EAGLE3_QUERY_SCALE × the normed embedding, k and v = the normed embedding, ``o_proj`` = I: attention
    copies the token's embedding into the (zero) residual stream; ``lm_head`` row σ(x) − FIRST_WORD_ID is x's
    unit-RMS embedding scaled as the target's rows are, so the head writes σ(x)."""
    embedding = embeddings(spec.seed)
    identity = np.eye(HIDDEN_SIZE, dtype=np.float32)
    zeros = np.zeros_like(identity)
    ones = np.ones(HIDDEN_SIZE, dtype=np.float32)
    head = np.zeros((EAGLE3_DRAFT_VOCAB, HIDDEN_SIZE), dtype=np.float32)
    for word, successor in draft_successors(spec.agreement, spec.seed).items():
        row = embedding[word]
        head[successor - FIRST_WORD_ID] = row / np.linalg.norm(row) * (spec.logit_scale / math.sqrt(HIDDEN_SIZE))
    t2d = np.zeros(len(VOCABULARY), dtype=bool)
    t2d[FIRST_WORD_ID:] = True
    small = _small_weights(spec)
    return {
        "fc.weight": np.zeros((HIDDEN_SIZE, HIDDEN_SIZE * len(EAGLE3_AUX_LAYERS)), dtype=np.float32),
        "midlayer.input_layernorm.weight": ones,
        "midlayer.hidden_norm.weight": np.zeros(HIDDEN_SIZE, dtype=np.float32),
        "midlayer.post_attention_layernorm.weight": ones,
        "midlayer.self_attn.q_proj.weight": np.concatenate([identity * EAGLE3_QUERY_SCALE, zeros], axis=1),
        "midlayer.self_attn.k_proj.weight": np.concatenate([identity, zeros], axis=1),
        "midlayer.self_attn.v_proj.weight": np.concatenate([identity, zeros], axis=1),
        "midlayer.self_attn.o_proj.weight": identity.copy(),
        "midlayer.mlp.gate_proj.weight": small(INTERMEDIATE_SIZE, HIDDEN_SIZE),
        "midlayer.mlp.up_proj.weight": small(INTERMEDIATE_SIZE, HIDDEN_SIZE),
        "midlayer.mlp.down_proj.weight": np.zeros((HIDDEN_SIZE, INTERMEDIATE_SIZE), dtype=np.float32),
        "norm.weight": ones,
        "lm_head.weight": head,
        "d2t": np.full(EAGLE3_DRAFT_VOCAB, FIRST_WORD_ID, dtype=np.int64),
        "t2d": t2d,
    }


def head_successors(head: dict[str, np.ndarray], target: dict[str, np.ndarray]) -> np.ndarray:
    """What an EAGLE head (eagle_tensors or eagle3_tensors) drafts after each word, computed from its weights and
    the target's as vLLM's forward does, for a head whose layer adds nothing but (EAGLE-3) its attention on the
    token itself. -1 for the special tokens."""
    embedding = target["model.embed_tokens.weight"]
    words = np.arange(FIRST_WORD_ID, len(VOCABULARY))
    result = np.full(len(VOCABULARY), -1)
    if "d2t" not in head:  # EAGLE-1: fc over [own embedding, target hidden state (dropped)], target lm_head
        hidden = head["embed_tokens.weight"][words] @ head["fc.weight"][:, :HIDDEN_SIZE].T
        result[words] = np.argmax(hidden @ target["lm_head.weight"].T, axis=1)
        return result
    v = unit_rms(embedding[words]) @ head["midlayer.self_attn.v_proj.weight"][:, :HIDDEN_SIZE].T
    hidden = unit_rms(v @ head["midlayer.self_attn.o_proj.weight"].T) * head["norm.weight"]
    drafted = np.argmax(hidden @ head["lm_head.weight"].T, axis=1)
    result[words] = drafted + head["d2t"][drafted]
    return result


def attention_margin(head: dict[str, np.ndarray], seed: int = DEFAULT_SEED) -> float:
    """The smallest gap, over every word and head, between an EAGLE-3 head's attention score of a position on
    itself and on a position holding another word (same position, so without RoPE's rotation): the softmax
    weight it leaves on other words is at most (positions) × e^-gap."""
    normed = unit_rms(embeddings(seed)[FIRST_WORD_ID:])
    q = normed @ head["midlayer.self_attn.q_proj.weight"][:, :HIDDEN_SIZE].T
    k = normed @ head["midlayer.self_attn.k_proj.weight"][:, :HIDDEN_SIZE].T
    gaps = []
    for start in range(0, HIDDEN_SIZE, HEAD_DIM):
        scores = q[:, start:start + HEAD_DIM] @ k[:, start:start + HEAD_DIM].T / math.sqrt(HEAD_DIM)
        own = np.diag(scores).copy()
        np.fill_diagonal(scores, -np.inf)
        gaps.append(float(np.min(own - scores.max(axis=1))))
    return min(gaps)


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
        "config.json": config_for(spec),
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

    `agreement` is used by drafts and EAGLE heads only (SPECULATOR_KINDS): the fraction of the predictable half
    whose successor the draft gets right. A cached copy with other parameters is regenerated; writing goes to a temporary sibling renamed into
    place, so a directory that exists is complete.
    """
    speculates = kind in SPECULATOR_KINDS
    spec = StandinSpec(kind=kind, agreement=agreement if speculates else 1.0, logit_scale=logit_scale, seed=seed)
    if speculates:
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
