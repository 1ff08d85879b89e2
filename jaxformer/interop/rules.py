"""The shared vocabulary of the per-architecture interop files: how a file's config maps to a
ModelConfig (``Architecture``), how each tensor maps to a parameter (``Rule``), and the two engines
that run rules in either direction.

Loading (``build_from_tensors``) reads every tensor a rule needs, transforms it, stacks layers, and
checks every shape against the abstract model before anything is built: missing, unexpected and
mis-shaped tensors are reported together, and nothing partial is ever loaded. Saving
(``export_with_rules``) runs the same rules backwards, so a round trip returns the same bytes.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import re
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.model_config import ModelConfig, RopeScaling
from jaxformer.interop.files import contiguous
from jaxformer.interop.reference_keys import harmless_reason
from jaxformer.layers.weights import refuse_decoding_copy
from jaxformer.models import abstract_model


# --------------------------------------------------------------------------------------------------
# Architectures


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One Hugging Face model family as jaxformer reads and writes it; one file under ``interop``
    defines each, and ``interop.registry`` lists them.

    ``classes``: model_type -> the transformers classes supported (the first is the default).
    ``prefix``: model_type -> where head classes nest the base model's tensors ("model.", ...); or a tuple of
    prefixes, one per layout of the type's files, the first the one written (LLaVA's).
    ``base_classes``: classes whose tensors are not nested (saved alone).
    ``config_from_hf(hf, model_type, arch, tensor_names)``: ModelConfig fields of a config.json.
    ``config_to_hf(cfg, model_type, out)``: fills a config.json dict for ``cfg``.
    ``rules(cfg, model_type, arch, prefix)``: tensor rules and tied-tensor aliases.
    """

    classes: dict[str, tuple[str, ...]]
    prefix: dict[str, str | tuple[str, ...]]
    base_classes: tuple[str, ...]
    config_from_hf: Callable[[dict, str, str, set[str]], dict[str, Any]]
    config_to_hf: Callable[[ModelConfig, str, dict], None]
    rules: Callable[[ModelConfig, str, str, str], tuple[list[Rule], dict[str, str]]]
    # ``ignored(hf, tensor_names) -> (names, note)``: tensors a file may carry that the forward pass never
    # reads (DeepSeek-V3's multi-token-prediction layers); they are skipped with the note as a warning.
    ignored: Callable[[dict, set[str]], tuple[set[str], str]] | None = None
    # config.json keys (by path: 'decoder.is_decoder') that change no number of this architecture's forward
    # pass, each with the reason; any other key its config_from_hf does not read is refused at load.
    harmless: dict[str, str] = dataclasses.field(default_factory=dict)
    # Model types that hold only what another type of this file holds, or little more (XLM-R's files are RoBERTa's,
    # mT5's T5's, Phi-3's LLaMA's and Mistral's in fused tensors): written only for a model loaded from one. Every
    # other type is an export target for any config it holds (registry.hf_target), in the order of ``classes``.
    only_as_loaded: tuple[str, ...] = ()
    # Model types of multimodal files (a vision tower beside a text model under ``text_config``) whose text model
    # loads: never written, not even for a model loaded from one; the text model is written as its own type.
    wrappers: tuple[str, ...] = ()
    # model_type -> its config class's defaults for the keys a file may leave out (token ids included):
    # the loader fills them in before config_from_hf reads the file, as transformers' config class does.
    defaults: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


# --------------------------------------------------------------------------------------------------
# Config helpers


class ConfigReader(dict):
    """A config.json (or one of its sub-configs, T5Gemma's ``encoder``) that records every key an
    architecture reads, so that a key nothing read can be refused instead of dropped (``unread``). Keys
    are recorded by path ('encoder.sliding_window'); ``with_defaults`` and ``sub`` share the record."""

    def __init__(self, data: dict, read: set[str] | None = None, prefix: str = ""):
        super().__init__(data)
        self.read = set() if read is None else read
        self.prefix = prefix
        self.subs: list[ConfigReader] = []

    def _note(self, key) -> None:
        self.read.add(f"{self.prefix}{key}")

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key) -> bool:
        self._note(key)
        return super().__contains__(key)

    def sub(self, key: str) -> ConfigReader:
        """The sub-config under ``key``, itself recorded key by key."""
        reader = ConfigReader(self[key], self.read, f"{self.prefix}{key}.")
        self.subs.append(reader)
        return reader

    def unread(self) -> list[str]:
        """Paths of the keys this config holds that nothing read (sub-configs' keys by their own paths)."""
        opened = {reader.prefix[:-1] for reader in self.subs}
        keys = [f"{self.prefix}{k}" for k in dict.keys(self) if f"{self.prefix}{k}" not in self.read | opened]
        return keys + [key for reader in self.subs for key in reader.unread()]


# Keys of any config.json that change no number jaxformer computes (by their last path component).
HARMLESS = {
    **dict.fromkeys(("architectures", "model_type", "transformers_version", "_name_or_path", "auto_map",
                     "_attn_implementation_autoset", "attn_implementation", "torchscript", "tokenizer_class",
                     "task_specific_params", "finetuning_task", "prefix"), "bookkeeping"),
    **dict.fromkeys(("use_cache", "output_past", "output_attentions", "output_hidden_states", "return_dict",
                     "use_return_dict", "output_router_logits"), "what a call returns, chosen per call here"),
    "gradient_checkpointing": "memory of a training step, not its numbers",
    # read at the top level (the default load dtype); a sub-config's copy (T5Gemma's halves) says the same
    **dict.fromkeys(("dtype", "torch_dtype"), "the dtype the tensors were saved in, which they carry themselves"),
    "chunk_size_feed_forward": "runs the feed-forward over slices of the sequence: the same numbers",
    "is_encoder_decoder": "bookkeeping (the family follows from model_type)",
    "cache_implementation": "how transformers lays out its KV cache, not what it holds",
    **dict.fromkeys(("id2label", "label2id", "problem_type", "_num_labels"),
                    "label names (num_labels comes from the head's tensors)"),
    **dict.fromkeys(("initializer_range", "initializer_factor", "init_std"), "initialisation of new weights only"),
    **dict.fromkeys(("classifier_dropout", "classifier_dropout_rate", "activation_dropout", "embd_pdrop",
                     "summary_first_dropout", "summary_last_dropout"),
                    "training-time dropout jaxformer does not model (no effect in evaluation)"),
    **dict.fromkeys(("forced_bos_token_id", "forced_eos_token_id", "bad_words_ids", "renormalize_logits"),
                    "forcing and banning tokens in generation, which generate() applies as transformers does "
                    "(generation_defaults)"),
}
# Generation defaults older config.json files carry (and generation_config.json files), with transformers'
# own default of each: its generate() applies a file's value when no argument says otherwise; jaxformer's
# generate takes these as arguments, so loading names the ones that differ in a warning rather than dropping
# them in silence. (Token ids, forced BOS/EOS and bad words are applied: jaxformer.generate.generation_defaults.)
GENERATION_KEYS = {"max_length": 20, "min_length": 0, "num_beams": 1, "early_stopping": False,
                   "no_repeat_ngram_size": 0, "length_penalty": 1.0, "do_sample": False, "temperature": 1.0,
                   "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0, "num_return_sequences": 1,
                   "diversity_penalty": 0.0, "num_beam_groups": 1, "typical_p": 1.0,
                   "encoder_no_repeat_ngram_size": 0, "suppress_tokens": None, "begin_suppress_tokens": None,
                   "remove_invalid_values": False, "max_new_tokens": None, "exponential_decay_length_penalty": None,
                   "sep_token_id": None, "output_scores": False, "return_dict_in_generate": False}


def account_for_every_key(hf: ConfigReader, arch: Architecture, model_type: str, where: str) -> None:
    """After an architecture read ``hf``: refuse any key nothing read that may change the numbers (a field
    that changes them and is dropped makes the user's comparison look like a PyTorch difference), and name
    the generation defaults jaxformer's generate does not apply. A key changes nothing when it is harmless
    here, or when transformers' own class never reads it or holds it at its default (``reference_keys``)."""

    def value(path: str):
        tree = dict(hf)
        for part in path.split("."):
            tree = tree[part]
        return tree

    def owner(path: str) -> str:
        """The model_type whose config class holds ``path``: its innermost sub-config's (T5Gemma's halves)."""
        owner_type, tree = model_type, dict(hf)
        for part in path.split(".")[:-1]:
            tree = tree[part]
            owner_type = tree.get("model_type", owner_type)
        return owner_type

    unread = [key for key in hf.unread() if key.rsplit(".", 1)[-1] not in HARMLESS and key not in arch.harmless]
    generation = [key for key in unread if key.rsplit(".", 1)[-1] in GENERATION_KEYS]
    refused = [key for key in unread if key not in generation
               and harmless_reason(owner(key), key.rsplit(".", 1)[-1], value(key)) is None]

    if refused:
        raise ValueError(f"{where}: config.json sets {', '.join(f'{k}={value(k)!r}' for k in refused)}, which "
                         "jaxformer does not read; such a setting may change the numbers, so the load is refused rather "
                         "than the setting dropped")
    differing = [key for key in generation if value(key) != GENERATION_KEYS[key.rsplit(".", 1)[-1]]]
    if differing:
        warnings.warn(f"{where}: config.json holds generation defaults "
                      f"({', '.join(f'{k}={value(k)!r}' for k in differing)}) that transformers' generate() applies "
                      "when no generation_config.json overrides them; jaxformer's generate takes them as arguments",
                      stacklevel=4)


def sub_config(hf: dict, key: str) -> dict:
    """The sub-config under ``key`` (T5Gemma's encoder and decoder), recorded when ``hf`` is a reader."""
    return hf.sub(key) if isinstance(hf, ConfigReader) else hf[key]


def with_defaults(hf: dict, defaults: dict) -> dict:
    """``hf`` over its config class's defaults (what a file that leaves a key out means), still recording
    what is read when ``hf`` is a ConfigReader."""
    if isinstance(hf, ConfigReader):
        return ConfigReader({**defaults, **dict(hf.items())}, hf.read, hf.prefix)  # recorded under the same paths
    return {**defaults, **hf}


def text_model_from_hf(hf: dict, model_type: str, defaults: dict,
                       read_text: Callable[[dict], dict[str, Any]]) -> dict[str, Any]:
    """The fields of a multimodal file's text model (its ``text_config`` over the text config class's
    ``defaults``, read by ``read_text``) with the file's vocabulary and token ids, which live in the text config.
    The wrapper's own tie_word_embeddings is the one transformers ties by, so a text config that disagrees is
    refused rather than read either way."""
    text = with_defaults(sub_config(hf, "text_config"), defaults)
    refuse(bool(hf["tie_word_embeddings"]) != bool(text["tie_word_embeddings"]), f"{model_type}: "
           "tie_word_embeddings differs between the file and its text_config")
    return {**read_text(text), **({"vocab_size": text["vocab_size"]} if text["vocab_size"] is not None else {}),
            **text_token_ids(text)}


TEXT_TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")


def text_token_ids(text: dict) -> dict[str, Any]:
    """The token ids a multimodal file's text config sets (they live there, not at the file's top level)."""
    return {key: text[key] for key in TEXT_TOKEN_IDS if text.get(key) is not None}


def ids_into_text_config(out: dict, text: dict) -> None:
    """Move the vocabulary and token ids written at ``out``'s top level into ``text``, the multimodal file's text
    config, where alone they live (``text`` already holds its vocabulary)."""
    for key in ("vocab_size", *TEXT_TOKEN_IDS):
        value = out.pop(key, None)
        if key in TEXT_TOKEN_IDS and value is not None:
            text[key] = value


def labels_from_hf(hf: dict) -> tuple[int, tuple[str, ...]]:
    """(num_labels, label names) of a classifier's config.json: id2label's count and names (transformers'
    defaults, LABEL_0 ..., say nothing a label id does not, so they are dropped), else num_labels."""
    num_labels = len(hf["id2label"]) if hf.get("id2label") else int(hf.get("num_labels", 2))
    names = tuple(hf["id2label"][key] for key in sorted(hf.get("id2label") or {}, key=int))
    return num_labels, names if any(name != f"LABEL_{i}" for i, name in enumerate(names)) else ()


def labels_to_hf(cfg: ModelConfig, out: dict) -> None:
    """A classifier's id2label and label2id (its names, or transformers' defaults), unless the file had them."""
    if cfg.head in ("sequence_classification", "token_classification"):
        names = cfg.head_options.label_names or tuple(f"LABEL_{i}" for i in range(cfg.head_options.num_labels))
        out.setdefault("id2label", {str(i): name for i, name in enumerate(names)})
        out.setdefault("label2id", {name: i for i, name in enumerate(names)})


ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_fast": "gelu_tanh", "silu": "silu", "swish": "silu", "quick_gelu": "quick_gelu"}
GATED = {"silu": "swiglu", "swish": "swiglu", "gelu_new": "geglu", "gelu_pytorch_tanh": "geglu"}


def refuse(condition: bool, message: str) -> None:
    if condition:
        raise ValueError(message)


def activation(name: str, gated: bool, model_type: str) -> str:
    table = GATED if gated else ACTIVATIONS
    if name not in table:
        raise ValueError(f"{model_type}: activation {name!r}{' (gated)' if gated else ''} is not supported; "
                         f"supported: {sorted(table)}")
    return table[name]


def rope_from_hf(hf: dict, default_theta: float = 10000.0) -> tuple[float, RopeScaling | None]:
    """(theta, scaling) of a config.json as transformers 5 reads it: a ``rope_scaling`` entry (older files,
    or one added to a transformers-5 file for long context) replaces ``rope_parameters`` whole, and the
    base comes from the chosen dict, else the file's top-level ``rope_theta``, else the config class's
    default (``default_theta``: 1e6 for Mixtral, 1e4 for most)."""
    return rope_spec(rope_params(hf, default_theta), hf.get("max_position_embeddings"))


def partial_rope_from_hf(hf: dict, default_fraction: float, default_theta: float = 10000.0
                         ) -> tuple[float, RopeScaling | None, float]:
    """(theta, scaling, the fraction of each head that rotates) for an architecture whose config class
    reads ``partial_rotary_factor`` (GLM): from the rope dict, else the file's top level, else the class's."""
    params = rope_params(hf, default_theta)
    top = hf.get("partial_rotary_factor")
    fraction = float(params.pop("partial_rotary_factor", top if top is not None else default_fraction))
    return (*rope_spec(params, hf.get("max_position_embeddings")), fraction)


def rotary_width(head_dim: int, fraction: float, model_type: str) -> int | None:
    """ModelConfig.rotary_dim of a partial_rotary_factor as transformers truncates it (None: the whole head),
    refusing a width that is odd or zero."""
    rotary = int(head_dim * fraction)
    refuse(not 0 < rotary <= head_dim or rotary % 2, f"{model_type}: partial_rotary_factor={fraction} gives "
           f"{rotary} rotating numbers of a {head_dim}-wide head; they must be even and > 0")
    return None if rotary == head_dim else rotary


def prediction_layers(hf: dict, names: set[str], count: int) -> tuple[set[str], str]:
    """The tensors of ``count`` multi-token-prediction layers that files (DeepSeek-V3, GLM-4.5) carry past
    num_hidden_layers, which next-token prediction never reads, and the note that says they were skipped."""
    layers = hf.get("num_hidden_layers", 0)
    extra = {n for n in names
             if (found := re.search(r"(?:^|\.)layers\.(\d+)\.", n)) and layers <= int(found.group(1)) < layers + count}
    note = (f"{len(extra)} tensors of multi-token-prediction layers (index >= num_hidden_layers={layers}) are not "
            "used by jaxformer and were skipped") if extra else ""
    return extra, note


def rope_params(hf: dict, default_theta: float) -> dict:
    """The rotary dict as transformers 5 resolves a config.json's: ``rope_scaling`` (older files) replacing
    ``rope_parameters`` whole, its rope_theta else the file's top-level one else ``default_theta``."""
    scaling, parameters = hf.get("rope_scaling"), hf.get("rope_parameters")  # both read: the first replaces the other
    params = dict(scaling or parameters or {})
    params.setdefault("rope_theta", hf.get("rope_theta", default_theta))
    beside = hf.get("original_max_position_embeddings")  # read whatever the kind: only some use it
    if beside is not None and _kind(params) in PRETRAINED_LENGTH:
        # Phi-3 keeps the pretraining length beside the rope dict, and there it wins
        params["original_max_position_embeddings"] = beside
    return params


# The keys each rotary kind reads, beside rope_type / type and rope_theta; those it cannot do without.
ROPE_KEYS = {"default": (), "linear": ("factor",), "dynamic": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
             "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                      "mscale", "mscale_all_dim", "truncate"),
             "longrope": ("short_factor", "long_factor", "factor", "original_max_position_embeddings",
                          "attention_factor")}
ROPE_REQUIRED = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
                 "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
                 "longrope": ("short_factor", "long_factor")}
# The kinds that measure against the pretraining length; transformers fills it in from max_position_embeddings.
PRETRAINED_LENGTH = ("llama3", "yarn", "longrope")


def _kind(params: dict) -> str:
    return params.get("rope_type", params.get("type", "default"))


def rope_spec(params: dict, max_positions: int | None) -> tuple[float, RopeScaling | None]:
    """(theta, scaling) of one resolved rotary dict (``rope_type``, or the older ``type``; ``rope_theta``)
    of a model with ``max_positions`` (its max_position_embeddings). A key its kind does not read is refused
    by name (it would change the angles: a partial_rotary_factor, a yarn setting on a linear entry); what
    transformers derives when it is absent or null is derived the same way: the pretraining length, yarn's
    and longrope's factor (max_positions over that length), yarn's betas (32 and 1)."""
    theta = float(params["rope_theta"])
    kind = _kind(params)
    refuse(kind not in ROPE_KEYS, f"rope type {kind!r} is not supported; supported: {', '.join(map(repr, ROPE_KEYS))}")
    extra = sorted(set(params) - {"rope_type", "type", "rope_theta", *ROPE_KEYS[kind]})
    if params.get("partial_rotary_factor") == 1.0:  # every dimension rotates: what jaxformer does
        extra.remove("partial_rotary_factor")
    refuse(bool(extra), f"rope settings {', '.join(f'{k}={params[k]!r}' for k in extra)} are not supported "
           f"for rope type {kind!r}")
    missing = [k for k in ROPE_REQUIRED.get(kind, ()) if k not in params or (kind != "yarn" and params[k] is None)]
    refuse(bool(missing), f"rope type {kind!r} needs {', '.join(missing)} in its rope settings")
    if kind == "default":
        return theta, None
    if kind in ("linear", "dynamic"):
        return theta, RopeScaling(kind, float(params["factor"]))
    original = params.get("original_max_position_embeddings") or max_positions
    refuse(original is None, f"rope type {kind!r} needs original_max_position_embeddings or max_position_embeddings")
    if kind == "llama3":
        return theta, RopeScaling("llama3", float(params["factor"]), float(params["low_freq_factor"]),
                                  float(params["high_freq_factor"]), int(original))
    factor = params.get("factor")
    if factor is None:  # the extension the two lengths imply
        refuse(max_positions is None, f"rope type {kind!r} without factor needs max_position_embeddings")
        factor = max_positions / original
    attention_factor = params.get("attention_factor")
    common = dict(factor=float(factor), original_max_positions=int(original),
                  attention_factor=None if attention_factor is None else float(attention_factor))
    if kind == "longrope":
        return theta, RopeScaling("longrope", short_factor=tuple(params["short_factor"]),
                                  long_factor=tuple(params["long_factor"]), **common)
    optional = lambda key: None if params.get(key) is None else float(params[key])  # noqa: E731
    return theta, RopeScaling("yarn", beta_fast=float(params.get("beta_fast") or 32),
                              beta_slow=float(params.get("beta_slow") or 1),
                              truncate=bool(params.get("truncate", True)), mscale=optional("mscale"),
                              mscale_all_dim=optional("mscale_all_dim"), **common)


def rope_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """transformers 5's ``rope_parameters`` of ``cfg``: every setting written, none left to a default."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rotary.theta}
    s = cfg.rotary.scaling
    if s is None:
        return rope
    rope.update(rope_type=s.kind, factor=s.factor)
    if s.kind in PRETRAINED_LENGTH:
        rope["original_max_position_embeddings"] = s.original_max_positions
    if s.kind == "llama3":
        rope.update(low_freq_factor=s.low_freq_factor, high_freq_factor=s.high_freq_factor)
    if s.kind == "yarn":
        rope.update(beta_fast=s.beta_fast, beta_slow=s.beta_slow, truncate=s.truncate)
        rope.update({k: v for k, v in (("mscale", s.mscale), ("mscale_all_dim", s.mscale_all_dim)) if v is not None})
    if s.kind == "longrope":
        rope.update(short_factor=list(s.short_factor), long_factor=list(s.long_factor))
    if s.attention_factor is not None:
        rope["attention_factor"] = s.attention_factor
    return rope


# jaxformer activation -> the name transformers configs use
INVERSE_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_new", "silu": "silu",
                       "quick_gelu": "quick_gelu"}
# a gated activation -> the hidden_act of its gate, as transformers' gated MLPs spell it
INVERSE_GATED = {"swiglu": "silu", "geglu": "gelu_pytorch_tanh", "geglu_erf": "gelu"}


# --------------------------------------------------------------------------------------------------
# Tensor rules


@dataclasses.dataclass(frozen=True)
class Rule:
    """jaxformer parameters ``paths`` <-> HF tensors ``names``.

    Names may hold ``{i}`` (the layer); such a rule is applied per layer and its jaxformer arrays are
    stacked on a leading layers axis: every layer of the stack, or the HF layers listed in ``layers`` (a
    stack of some layers only: DeepSeek's first dense ones, Llama 4 Maverick's interleaved ones). ``load``
    maps the HF arrays to the jaxformer arrays (one per path), ``save`` is its exact inverse. An ``optional``
    rule's tensors may be absent from a file; with no paths it only checks a tensor that no parameter holds
    (Marian's computed sinusoids) and may write nothing back.
    """

    paths: tuple[tuple[str, ...], ...]
    names: tuple[str, ...]
    load: Callable[[list[np.ndarray]], list[np.ndarray]]
    save: Callable[[list[np.ndarray]], list[np.ndarray]]
    layers: tuple[int, ...] | None = None
    optional: bool = False

    @property
    def per_layer(self) -> bool:
        return any("{i}" in n for n in self.names)

    def layer_range(self, cfg: ModelConfig) -> range | tuple[int, ...]:
        """The HF layer indices this rule reads (a single pass, ``range(1)``, when not per layer)."""
        if not self.per_layer:
            return range(1)
        if self.layers is not None:
            return self.layers
        return range({"encoder": cfg.encoder_layers, "decoder": cfg.decoder_layers}[self.paths[0][0]])

    def in_layers(self, first: int, end: int) -> Rule:
        return dataclasses.replace(self, layers=tuple(range(first, end)))

    def at_layers(self, layers) -> Rule:
        return dataclasses.replace(self, layers=tuple(layers))


def copy(path, name) -> Rule:
    return Rule((path,), (name,), lambda t: [t[0]], lambda p: [p[0]])


def linear(path, name) -> Rule:
    """torch Linear weight [out, in] <-> kernel [in, out]."""
    return Rule((path,), (name,), lambda t: [t[0].T], lambda p: [p[0].T])


def heads_in(path, name, heads, head_dim) -> Rule:
    """q/k/v projection [N*H, D] <-> [D, N, H]."""
    return Rule((path,), (name,), lambda t: [t[0].T.reshape(-1, heads, head_dim)],
                lambda p: [p[0].reshape(p[0].shape[0], -1).T])


def fused_heads_in(paths, name, heads: tuple[int, ...], head_dim: int) -> Rule:
    """One fused projection [(N_1 + N_2 + ...) * H, D] (Phi-3's qkv_proj: queries, then keys, then values)
    <-> one [D, N_i, H] kernel per part."""
    bounds = np.cumsum([0, *heads])

    def load(t):
        w = t[0].T
        return [w[:, a * head_dim:b * head_dim].reshape(-1, b - a, head_dim) for a, b in zip(bounds, bounds[1:])]

    return Rule(tuple(paths), (name,), load,
                lambda p: [np.concatenate([k.reshape(k.shape[0], -1) for k in p], axis=1).T])


def fused_linear(paths, name) -> Rule:
    """One fused Linear [n * out, in] (Phi-3's gate_up_proj: the gate, then the up projection) <-> n
    kernels [in, out]."""
    return Rule(tuple(paths), (name,), lambda t: [w.T for w in np.split(t[0], len(paths))],
                lambda p: [np.concatenate([k.T for k in p], axis=0)])


def heads_out(path, name, heads, head_dim) -> Rule:
    """output projection [D, N*H] <-> [N, H, D]."""
    return Rule((path,), (name,), lambda t: [t[0].T.reshape(heads, head_dim, -1)],
                lambda p: [p[0].reshape(-1, p[0].shape[-1]).T])


def bias_heads(path, name, heads, head_dim) -> Rule:
    return Rule((path,), (name,), lambda t: [t[0].reshape(heads, head_dim)], lambda p: [p[0].reshape(-1)])


def norm(path, name, bias: bool, weight="weight", bias_name="bias") -> list[Rule]:
    rules = [copy(path + ("scale",), f"{name}.{weight}")]
    if bias:
        rules.append(copy(path + ("bias",), f"{name}.{bias_name}"))
    return rules


def dense(path, name, bias=True) -> list[Rule]:
    rules = [linear(path + ("kernel",), f"{name}.weight")]
    if bias:
        rules.append(copy(path + ("bias",), f"{name}.bias"))
    return rules


def attention(cfg: ModelConfig, path, q, k, v, o, q_bias=None, k_bias=None, v_bias=None, o_bias=None) -> list[Rule]:
    N, K, H = cfg.num_heads, cfg.kv_heads, cfg.head_dim_
    rules = [heads_in(path + ("q",), q, N, H), heads_in(path + ("k",), k, K, H),
             heads_in(path + ("v",), v, K, H), heads_out(path + ("o",), o, N, H)]
    if cfg.biases.qkv:
        rules += [bias_heads(path + ("q_bias",), q_bias, N, H), bias_heads(path + ("v_bias",), v_bias, K, H)]
        if cfg.biases.key:
            rules.append(bias_heads(path + ("k_bias",), k_bias, K, H))
    if cfg.biases.out:
        rules.append(copy(path + ("o_bias",), o_bias))
    return rules


def stacked_experts(path, names: list[str]) -> Rule:
    """One torch Linear [out, in] per expert <-> a kernel [E, in, out]."""
    return Rule((path,), tuple(names), lambda ts: [np.stack([t.T for t in ts])], lambda ps: [w.T for w in ps[0]])


def lm_head(cfg: ModelConfig, embedding: str) -> tuple[list[Rule], dict[str, str]]:
    """The LM head: an alias of the token embedding when tied (older files may still carry a
    copy, which must then equal it), else its own [V, D] tensor."""
    if cfg.head != "lm":
        return [], {}
    if cfg.embeddings.tie:
        return [], {"lm_head.weight": embedding}
    return [linear(("lm_head", "kernel"), "lm_head.weight")], {}


# --------------------------------------------------------------------------------------------------
# Running rules

# Non-parameter tensors older checkpoints carry; they hold nothing a model needs.
IGNORABLE = (".attn.bias", ".attn.masked_bias", ".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq",
             "embeddings.position_ids")


@functools.lru_cache(maxsize=8)
def _abstract_split(cfg: ModelConfig):
    """(graphdef, abstract state) of a config; tracing the constructor is the slow part, so keep a few."""
    return nnx.split(abstract_model(cfg))


def build_from_tensors(cfg: ModelConfig, rules: list[Rule], aliases: dict[str, str], names: set[str],
                       get: Callable[[str], np.ndarray], source: str):
    """Build the model of ``cfg`` from named tensors through ``rules``, or raise one ValueError that
    lists every missing, unexpected, mis-shaped and non-float tensor. Nothing is built until all of them
    check. Weights holding NaN or Inf load, with a warning naming them."""
    graphdef, state = _abstract_split(cfg)
    expected = {tuple(map(str, p)): v for p, v in nnx.to_flat_state(state)}

    param_dtype = np.dtype(jnp.dtype(cfg.param_dtype))
    missing, mismatched, not_float, loaded, used = [], [], [], {}, set()
    copies: list[tuple[np.ndarray, Any, np.ndarray, str]] = []  # (destination, index, source view, tensor name)
    for rule in rules:
        layer_ids = rule.layer_range(cfg)
        layers = len(layer_ids)
        groups = [[n.format(i=i) for n in rule.names] for i in layer_ids]
        absent = [n for group in groups for n in group if n not in names]
        used.update(n for group in groups for n in group if n in names)  # present, so never "unexpected"
        if absent:
            missing += [] if rule.optional and len(absent) == len(rule.names) * len(groups) else absent
            continue
        buffers = None
        for i, group in enumerate(groups):
            tensors = [get(n) for n in group]  # views into the mapped file where possible
            # An int8, int64 or bool tensor would load silently as floats (quantized files are refused, but for MXFP4
            # and FP8, decoded before this); an integer table loads into an integer buffer (DeepSeek-V4's tid2eid)
            integer = bool(rule.paths) and all(p in expected and jnp.issubdtype(expected[p].dtype, jnp.integer)
                                               for p in rule.paths)  # (a rule without paths loads nothing)
            not_float += [f"{n} ({t.dtype})" for n, t in zip(group, tensors)
                          if not jnp.issubdtype(t.dtype, jnp.integer if integer else jnp.floating)]
            parts = rule.load(tensors)
            shapes = [((layers,) if rule.per_layer else ()) + tuple(part.shape) for part in parts]
            bad = [f"{'/'.join(p)} from {group[0]}: file gives {shape}, config needs {tuple(expected[p].shape)}"
                   for p, shape in zip(rule.paths, shapes) if shape != tuple(expected[p].shape)]
            if bad:
                mismatched += bad
                buffers = None
                break
            if buffers is None:
                buffers = [_aligned_empty(shape, np.dtype(expected[p].dtype) if integer else param_dtype)
                           for p, shape in zip(rule.paths, shapes)]
            copies += [(buffer, i if rule.per_layer else ..., part, group[0]) for buffer, part in zip(buffers, parts)]
        if buffers is not None:
            loaded.update(zip(rule.paths, buffers))
    for alias, target in aliases.items():
        if alias in names:
            used.add(alias)
            if target in names and not np.array_equal(get(alias), get(target)):
                mismatched.append(f"{alias} should be tied to {target} but differs")
    unexpected = sorted(n for n in names - used if not n.endswith(IGNORABLE))
    not_covered = sorted("/".join(p) for p in expected if p not in loaded)
    if missing or unexpected or mismatched or not_float or not_covered:
        parts = []
        if missing:
            parts.append(f"missing tensors ({len(missing)}): {missing[:20]}")
        if unexpected:
            parts.append(f"unexpected tensors ({len(unexpected)}): {unexpected[:20]}")
        if mismatched:
            parts.append(f"mis-shaped tensors ({len(mismatched)}): {mismatched[:20]}")
        if not_float:
            parts.append(f"non-float tensors where float weights belong ({len(not_float)}): {not_float[:20]} "
                         "(quantized checkpoints other than MXFP4 and block-wise FP8 are not supported)")
        if not_covered and not missing:
            parts.append(f"parameters with no source: {not_covered[:20]}")
        raise ValueError(f"{source}; nothing was loaded.\n  " + "\n  ".join(parts))

    def copy(task) -> str | None:
        """The one copy (and cast) per byte, then a finiteness check of what was written; numpy releases
        the GIL, so threads overlap. Returns the tensor's name when it holds NaN or Inf."""
        destination, index, source_view, name = task
        destination[index] = source_view
        return None if _finite(destination[index]) else name

    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        non_finite = sorted({name for name in pool.map(copy, copies) if name is not None})
    if non_finite:
        warnings.warn(f"weights hold NaN or Inf values ({len(non_finite)} tensors): {non_finite[:20]}", stacklevel=3)
    flat = [(p, var.replace(_to_device(loaded[tuple(map(str, p))]))) for p, var in nnx.to_flat_state(state)]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def _finite(array: np.ndarray) -> bool:
    """No NaN or Inf in ``array``: both propagate through min and max, two vectorised passes with no
    temporary array (float32, float16); other float types are checked through float32."""
    if array.size == 0:
        return True
    if array.dtype in (np.float32, np.float16, np.float64):
        return bool(np.isfinite(array.min()) and np.isfinite(array.max()))
    return bool(np.isfinite(array.astype(np.float32)).all())


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype, alignment: int = 64) -> np.ndarray:
    """An uninitialised host array whose data is 64-byte aligned, so XLA's CPU backend can adopt it."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + alignment, np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _to_device(array: np.ndarray) -> jax.Array:
    """Hand an assembled host array to JAX: on CPU ``device_put`` adopts the aligned buffer without a copy.
    (DLPack adopted it too, but its deleter could run on an XLA thread while Python shut down, and about
    half the processes that freed a loaded model just before exiting aborted with std::terminate.)"""
    return jax.device_put(array)


def export_with_rules(model, rules: list[Rule]) -> dict[str, np.ndarray]:
    """Run ``rules`` backwards: the model's parameters as named numpy arrays (layers unstacked)."""
    refuse_decoding_copy(model, "export or save")
    cfg: ModelConfig = model.config
    flat = {tuple(map(str, p)): v for p, v in nnx.to_flat_state(nnx.state(model))}
    tensors: dict[str, np.ndarray] = {}
    for rule in rules:
        arrays = [np.asarray(jax.device_get(flat[p][...])) for p in rule.paths]
        if rule.per_layer:
            layer_ids = rule.layer_range(cfg)
            for index, i in enumerate(layer_ids):
                for name, t in zip(rule.names, rule.save([a[index] for a in arrays])):
                    tensors[name.format(i=i)] = contiguous(t)
        else:
            tensors.update((name, contiguous(t)) for name, t in zip(rule.names, rule.save(arrays)))
    return tensors
