"""Longformer (``longformer``): config and tensor rules, both directions.

RoBERTa's encoder (positions counted from the pad id, post-norm layers, RoBERTa's MLM and classification heads)
whose self-attention is local: a token sees the keys within ``attention_window / 2`` either side (jaxformer's
'bidirectional_sliding' layers, one window for every layer), plus the global tokens of the call
(``global_attention_mask``), which attend to every token and which every token attends to, through their own
projections ``query_global``, ``key_global``, ``value_global`` (``global_tokens``: the 'global' mixer). Where the
call names no global tokens, the heads choose them as transformers' do: the sequence classifier's first token, the
span head's question (the tokens before the first ``sep_token_id``). transformers pads the input to a multiple of
the window and computes banded products; jaxformer masks the whole sequence, which scores the same keys, so the
real tokens' numbers agree and no padding is needed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer.model_config import ModelConfig
from jaxformer.interop import bert
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, bias_heads, heads_in,
                                     labels_from_hf, labels_to_hf, refuse)

_HEADS = {"Model": "none", "ForMaskedLM": "mlm", "ForSequenceClassification": "sequence_classification",
          "ForTokenClassification": "token_classification", "ForQuestionAnswering": "question_answering"}
CLASSES = {"longformer": tuple(f"Longformer{suffix}" for suffix in _HEADS)}
# LongformerConfig's defaults, for the keys a file may leave out
DEFAULTS = {"longformer": dict(attention_window=512, sep_token_id=2, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                               hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                               max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12,
                               tie_word_embeddings=True)}


def _window(hf: dict) -> int:
    """The one-sided window (keys within it either side) of ``attention_window``: an even size, one for every
    layer or a list of one per layer, as LongformerConfig takes it."""
    windows, layers = hf["attention_window"], hf["num_hidden_layers"]
    windows = [windows] * layers if isinstance(windows, int) else list(windows)
    refuse(len(windows) != layers, f"longformer: attention_window lists {len(windows)} windows for "
           f"num_hidden_layers={layers}; it needs one per layer (or one int)")
    refuse(any(not isinstance(w, int) or w <= 0 or w % 2 for w in windows),
           f"longformer: attention_window={hf['attention_window']} must hold positive even sizes")
    refuse(len(set(windows)) > 1, f"longformer: attention_window={windows} differs between layers; jaxformer's "
           "layers share one window (every published Longformer has one)")
    return windows[0] // 2


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    head = _HEADS[arch.removeprefix("Longformer")]
    layers, offset = hf["num_hidden_layers"], hf["pad_token_id"] + 1
    # A base model has a pooler when its file does (add_pooling_layer is not in config.json); the classifier's
    # dense layer and tanh are one.
    pooler = head == "sequence_classification" or (
        head == "none" and (not tensor_names or any(n.endswith("pooler.dense.weight") for n in tensor_names)))
    num_labels, label_names = labels_from_hf(hf)
    return dict(family="encoder", d_model=hf["hidden_size"], num_heads=hf["num_attention_heads"],
                d_ff=hf["intermediate_size"], encoder_layers=layers, decoder_layers=0, norm_position="post",
                norm_eps=hf["layer_norm_eps"], embedding_norm=True, final_norm=False,
                activation=activation(hf["hidden_act"], False, model_type), position="learned",
                max_positions=hf["max_position_embeddings"] - offset, position_offset=offset,
                pad_aware_positions=True, type_vocab_size=hf["type_vocab_size"], attention="alternating",
                window_size=_window(hf), layer_types=("sliding",) * layers, global_tokens=True,
                sep_token_id=hf["sep_token_id"], head=head, pooler=pooler, num_labels=num_labels,
                label_names=label_names, dropout_rate=hf["hidden_dropout_prob"],
                attention_dropout_rate=hf["attention_probs_dropout_prob"], tie_embeddings=hf["tie_word_embeddings"])


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    out.update(hidden_size=cfg.d_model, num_attention_heads=cfg.num_heads, intermediate_size=cfg.d_ff,
               num_hidden_layers=cfg.encoder_layers, layer_norm_eps=cfg.norms.eps,
               hidden_act=INVERSE_ACTIVATIONS[cfg.activation],
               max_position_embeddings=cfg.max_positions + cfg.embeddings.position_offset,
               type_vocab_size=cfg.embeddings.types, attention_window=[2 * cfg.window_size] * cfg.encoder_layers,
               sep_token_id=cfg.tokens.sep, hidden_dropout_prob=cfg.dropout_rate,
               attention_probs_dropout_prob=cfg.attention_dropout_rate, tie_word_embeddings=cfg.embeddings.tie)
    labels_to_hf(cfg, out)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    """RoBERTa's tensors under ``longformer.``, and each layer's global projections."""
    out, aliases = bert.rules(cfg, "roberta", "Roberta" + arch.removeprefix("Longformer"), prefix)
    N, K, H = cfg.num_heads, cfg.kv_heads, cfg.head_dim_
    layer, stack = f"{prefix}encoder.layer.{{i}}.attention.self", ("encoder", "blocks", "attn")
    for name, heads in (("query", N), ("key", K), ("value", K)):
        ours = {"query": "q_global", "key": "k_global", "value": "v_global"}[name]
        out += [heads_in(stack + (ours,), f"{layer}.{name}_global.weight", heads, H),
                bias_heads(stack + (f"{ours}_bias",), f"{layer}.{name}_global.bias", heads, H)]
    return out, aliases


def global_attentions(local: np.ndarray, global_probs: np.ndarray | None, is_global: np.ndarray,
                      window: int) -> np.ndarray:
    """transformers' Longformer attentions as the [B, N, T, T] probabilities every other model returns.

    ``local`` [B, N, T, G + 2w + 1] holds, per query, its probabilities of the G global tokens (in order of
    position; columns past a row's own count are zero) then of the keys t - w .. t + w; a global query's row is
    zero there and its probabilities are ``global_probs`` [B, N, T_padded, G] (key s, global query g, over the
    sequence transformers padded to a multiple of the window). ``is_global`` [B, T] says which tokens are global."""
    B, N, T, width = local.shape
    G = width - (2 * window + 1)
    dense = np.zeros((B, N, T, T), local.dtype)
    for offset in range(-window, window + 1):  # the band: key t + offset
        t = np.arange(max(0, -offset), min(T, T - offset))
        dense[:, :, t, t + offset] = local[:, :, t, G + window + offset]
    for b in range(B):
        where = np.flatnonzero(is_global[b])
        for g, token in enumerate(where):
            dense[b, :, :, token] += local[b, :, :, g]  # (a global key's band column is masked: zero)
            dense[b, :, token, :] = global_probs[b, :, :T, g]
    return dense


ARCHITECTURE = Architecture(CLASSES, {"longformer": "longformer."}, ("LongformerModel",), config_from_hf,
                            config_to_hf, rules, defaults=DEFAULTS, harmless={
                                "onnx_export": "chooses unfold over as_strided for the same banded products"})
