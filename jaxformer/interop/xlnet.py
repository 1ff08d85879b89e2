"""XLNet (``xlnet``) as Transformer-XL: config and tensor rules, both directions.

XLNet's content stream, without permutation masks or target mappings, is Transformer-XL's relative
attention over a segment memory (``mems``), with XLNet's segment term when token types are given; that
is the part jaxformer runs, in the decoder family with ``position='xl'``. Two-stream permutation
pretraining (``perm_mask``, ``target_mapping``, the query stream's ``mask_emb``) is not modelled: a
checkpoint's ``mask_emb`` is skipped with a note on load and not written back.

Layouts: q, k, v and r are stored [D, N, H] as jaxformer keeps them; o is [D, N, H] where jaxformer
keeps [N, H, D]. transformers keeps a u/v bias pair per layer; an old config's ``untie_r: false`` (one
pair for all layers, as Transformer-XL trained) is read as ``shared_relative_biases``, and the layers'
copies must then be equal.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer.model_config import ModelConfig
from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, Architecture, Rule, activation, copy, lm_head, norm, refuse)

CLASSES = {"xlnet": ("XLNetLMHeadModel", "XLNetModel")}
# XLNetConfig's: a file without mem_len keeps a 512-token memory
DEFAULTS = {"xlnet": dict(mem_len=512, pad_token_id=5, bos_token_id=1, eos_token_id=2)}


def config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    refuse(hf.get("attn_type", "bi") not in ("uni", "bi"), f"xlnet: attn_type={hf.get('attn_type')!r} is not 'uni' or 'bi'")
    refuse(bool(hf.get("bi_data", False)), "xlnet: bi_data=True (bidirectional data pipelines of pretraining) is "
                                           "not supported")
    refuse(bool(hf.get("same_length", False)), "xlnet: same_length=True is not supported")
    refuse(bool(hf.get("reuse_len")), "xlnet: reuse_len (two-stream permutation pretraining) is not supported")
    d_model, heads = hf["d_model"], hf["n_head"]
    refuse((hf.get("d_head") or d_model // heads) * heads != d_model, "xlnet: d_head * n_head must equal d_model")
    lm = arch == "XLNetLMHeadModel"
    return dict(family="decoder", d_model=d_model, num_heads=heads, d_ff=hf["d_inner"], decoder_layers=hf["n_layer"],
                norm="layernorm", norm_position="post", norm_eps=hf.get("layer_norm_eps", 1e-12), final_norm=False,
                activation=activation(hf.get("ff_activation", "gelu"), False, model_type), position="xl",
                attention="causal" if hf.get("attn_type", "bi") == "uni" else "bidirectional",
                memory_len=hf.get("mem_len") or 0, clamp_len=max(hf.get("clamp_len", -1), 0),
                shared_relative_biases=not hf.get("untie_r", True), relative_segments=True,
                qkv_bias=False, out_bias=False, mlp_bias=True, head="lm" if lm else "none",
                tie_embeddings=hf.get("tie_word_embeddings", True), lm_head_bias=lm,
                dropout_rate=hf.get("dropout", 0.1), attention_dropout_rate=hf.get("dropout", 0.1))


def config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    out.update(d_model=cfg.d_model, n_head=cfg.num_heads, d_head=cfg.head_dim_, d_inner=cfg.d_ff,
               n_layer=cfg.decoder_layers, layer_norm_eps=cfg.norms.eps,
               ff_activation=INVERSE_ACTIVATIONS[cfg.activation],
               attn_type="uni" if cfg.attention == "causal" else "bi", mem_len=cfg.segment_memory or None,
               clamp_len=cfg.xl.clamp_len or -1, untie_r=not cfg.xl.shared_biases,
               tie_word_embeddings=cfg.embeddings.tie, dropout=cfg.dropout_rate, bi_data=False, same_length=False)


def rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    p, L = prefix, ("decoder", "blocks")
    layer = f"{p}layer.{{i}}"
    attn = f"{layer}.rel_attn"

    def shared(path, name) -> Rule:
        """One u or v for every layer <-> each layer's copy (which must agree)."""
        names = tuple(f"{attn}.{name}".format(i=i) for i in range(cfg.decoder_layers))

        def load(tensors):
            if any(not np.array_equal(t, tensors[0]) for t in tensors[1:]):
                raise ValueError(f"xlnet: untie_r=false, but the layers' {name} differ; set untie_r=true to keep "
                                 "one per layer")
            return [tensors[0]]

        return Rule((path,), names, load, lambda ps: [ps[0]] * cfg.decoder_layers)

    out = [
        copy(("embed", "table"), f"{p}word_embedding.weight"),
        copy(L + ("attn", "q"), f"{attn}.q"),
        copy(L + ("attn", "k"), f"{attn}.k"),
        copy(L + ("attn", "v"), f"{attn}.v"),
        copy(L + ("attn", "r"), f"{attn}.r"),
        Rule((L + ("attn", "o"),), (f"{attn}.o",), lambda t: [t[0].transpose(1, 2, 0)],
             lambda ps: [ps[0].transpose(2, 0, 1)]),
        *norm(L + ("attn_norm",), f"{attn}.layer_norm", True),
        *norm(L + ("mlp_norm",), f"{layer}.ff.layer_norm", True),
        Rule((L + ("mlp", "wi"),), (f"{layer}.ff.layer_1.weight",), lambda t: [t[0].T], lambda ps: [ps[0].T]),
        copy(L + ("mlp", "bi"), f"{layer}.ff.layer_1.bias"),
        Rule((L + ("mlp", "wo"),), (f"{layer}.ff.layer_2.weight",), lambda t: [t[0].T], lambda ps: [ps[0].T]),
        copy(L + ("mlp", "bo"), f"{layer}.ff.layer_2.bias"),
        copy(L + ("attn", "segment_bias"), f"{attn}.r_s_bias"),
        copy(L + ("attn", "segment_embed"), f"{attn}.seg_embed"),
    ]
    if cfg.xl.shared_biases:
        out += [shared(("decoder", "content_bias"), "r_w_bias"), shared(("decoder", "position_bias"), "r_r_bias")]
    else:
        out += [copy(L + ("attn", "content_bias"), f"{attn}.r_w_bias"),
                copy(L + ("attn", "position_bias"), f"{attn}.r_r_bias")]
    head, aliases = lm_head(cfg, f"{p}word_embedding.weight")
    head = [Rule(r.paths, tuple(n.replace("lm_head.", "lm_loss.") for n in r.names), r.load, r.save) for r in head]
    aliases = {alias.replace("lm_head.", "lm_loss."): source for alias, source in aliases.items()}
    if cfg.head == "lm":
        head.append(copy(("logits_bias",), "lm_loss.bias"))
    return out + head, aliases


def ignored(hf: dict, tensor_names: set[str]) -> tuple[set[str], str]:
    """The query stream's mask embedding serves two-stream pretraining only; the content stream never reads it."""
    skipped = {n for n in tensor_names if n.endswith("mask_emb")}
    return skipped, ("xlnet: skipped the two-stream query embedding mask_emb; jaxformer runs XLNet's content "
                     "stream (Transformer-XL), and does not write mask_emb back")


ARCHITECTURE = Architecture(CLASSES, {"xlnet": "transformer."}, ("XLNetModel",), config_from_hf,
                            config_to_hf, rules, ignored, harmless={
                                **dict.fromkeys(("start_n_top", "end_n_top", "summary_type", "summary_use_proj",
                                                 "summary_activation"), "the QA and sequence-summary heads only"),
                                **dict.fromkeys(("use_mems_eval", "use_mems_train"),
                                                "whether transformers carries memory between calls; here the caller "
                                                "passes it")}, defaults=DEFAULTS)
