"""A config.json is read the way transformers' config class reads it: files as published (legacy keys,
keys left out) give the model a transformers-5 file of the same model gives, and the numbers of
transformers' own model loaded from that very file."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import warnings

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.compare import compare, format_table  # noqa: E402
from jaxformer.interop import cohere, gemma, glm, llama, mixtral, phi3, qwen  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402
from jaxformer.interop.registry import ARCHITECTURES, SUPPORTED  # noqa: E402

from published_configs import PUBLISHED  # noqa: E402

TOLERANCE = 1e-5
# The class whose defaults a model_type's files fall back to (T5Gemma: each half's module config).
CLASSES = {"t5gemma": "T5GemmaModuleConfig"}


def _class_defaults(model_type: str) -> dict:
    """The config class's field defaults; GPT-Neo's attention_types, None there, with the value the class
    derives on construction (other None fields, as num_key_value_heads, mean "the same as" and stay None)."""
    cls = getattr(transformers, CLASSES[model_type]) if model_type in CLASSES else \
        transformers.CONFIG_MAPPING[model_type]
    fields = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    if fields.get("attention_types", 0) is None:
        fields["attention_types"] = cls().attention_types
    return fields


# The rotary base a file without one means, for the LLaMA lineage's files (each names it once)
THETAS = {model_type: module.DEFAULT_THETA for module in (llama, mixtral, qwen, phi3, glm)
          for model_type in module.DEFAULTS}
THETAS.update(cohere.DEFAULT_THETAS)
TABLES = {**gemma.DEFAULTS,
          **{model_type: table for arch in ARCHITECTURES for model_type, table in arch.defaults.items()}}


@pytest.mark.parametrize("model_type, ours", sorted(TABLES.items()))
def test_defaults_for_keys_a_file_leaves_out_are_the_config_classes(model_type, ours):
    theirs = _class_defaults(model_type)
    assert {key: theirs.get(key, "not a field") for key in ours} == ours
    if model_type in THETAS:
        assert THETAS[model_type] == transformers.CONFIG_MAPPING[model_type].default_theta


# Each model type's sizes (a file must give them); every other key is left to the config class.
_SIZES = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_hidden_layers=2, vocab_size=97)
_DEEPSEEK = dict(_SIZES, moe_intermediate_size=16, num_key_value_heads=4, num_hidden_layers=5, kv_lora_rank=12,
                 qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12, n_routed_experts=16, num_experts_per_tok=2)
_QWEN3_NEXT = dict(_SIZES, num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
                   moe_intermediate_size=16, shared_expert_intermediate_size=16, linear_num_key_heads=2,
                   linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8)
_MLLAMA_TEXT = dict(_SIZES, num_key_value_heads=2, num_hidden_layers=3, cross_attention_layers=[1], bos_token_id=1,
                    eos_token_id=2, pad_token_id=0)
_MLLAMA_VISION = dict(hidden_size=32, num_hidden_layers=2, num_global_layers=1, attention_heads=4, intermediate_size=48,
                      vision_output_dim=96, image_size=28, patch_size=14, intermediate_layers_indices=[0, 1])
_QWEN2_5_VL_VISION = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=4, out_hidden_size=32)
SIZES = {"gpt2": dict(n_embd=32, n_head=4, n_layer=2, vocab_size=97),
         "distilbert": dict(dim=32, n_heads=4, n_layers=2, hidden_dim=48, vocab_size=97),
         "gpt_neo": dict(hidden_size=32, num_heads=4, num_layers=24, vocab_size=97),
         "openai-gpt": dict(n_embd=32, n_head=4, n_layer=2, vocab_size=97),
         "gptj": dict(n_embd=64, n_head=4, n_layer=2, rotary_dim=8, vocab_size=97),
         "gpt_neox": dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=48,
                          vocab_size=97),
         "opt": dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, ffn_dim=48, vocab_size=97),
         **dict.fromkeys(("t5", "mt5", "umt5"), dict(d_model=32, d_ff=48, d_kv=8, num_heads=4, num_layers=2, vocab_size=97)),
         **dict.fromkeys(("marian", "pegasus"), dict(d_model=32, encoder_ffn_dim=48, decoder_ffn_dim=48,
                                                     encoder_attention_heads=4, decoder_attention_heads=4,
                                                     encoder_layers=2, decoder_layers=2, vocab_size=97,
                                                     pad_token_id=1, decoder_start_token_id=1)),
         "mbart": dict(d_model=32, encoder_ffn_dim=48, decoder_ffn_dim=48, encoder_attention_heads=4,
                       decoder_attention_heads=4, encoder_layers=2, decoder_layers=2, vocab_size=97),
         "bigbird_pegasus": dict(d_model=32, encoder_ffn_dim=48, decoder_ffn_dim=48, encoder_attention_heads=4,
                                 decoder_attention_heads=4, encoder_layers=2, decoder_layers=2, vocab_size=97),
         "m2m_100": dict(d_model=32, encoder_ffn_dim=48, decoder_ffn_dim=48, encoder_attention_heads=4,
                         decoder_attention_heads=4, encoder_layers=2, decoder_layers=2, vocab_size=97),
         "bart": dict(d_model=32, encoder_ffn_dim=48, decoder_ffn_dim=48, encoder_attention_heads=4,
                      decoder_attention_heads=4, encoder_layers=2, decoder_layers=2, vocab_size=97),
         # (WhisperConfig's default vocabulary: its default token ids lie past 97)
         "whisper": dict(d_model=32, encoder_ffn_dim=48, decoder_ffn_dim=48, encoder_attention_heads=4,
                         decoder_attention_heads=4, encoder_layers=2, decoder_layers=2),
         "xlnet": dict(d_model=32, n_head=4, n_layer=2, d_inner=48, vocab_size=97),
         # DeBERTa's class defaults have no relative attention (refused: no published DeBERTa lacks it)
         **dict.fromkeys(("deberta", "deberta-v2"), dict(_SIZES, relative_attention=True, pos_att_type=["c2p", "p2c"])),
         "deepseek_v2": _DEEPSEEK, "deepseek_v3": _DEEPSEEK,
         "deepseek_v32": dict(_DEEPSEEK, index_n_heads=2, index_head_dim=16, n_group=1, topk_group=1),
         "glm_moe_dsa": dict(_DEEPSEEK, index_n_heads=2, index_head_dim=16, q_lora_rank=20),
         "mistral4": _DEEPSEEK,
         # Mistral Large 4: its indexer made tiny too, five layers (the fourth NoPE by the class's interval of 4)
         "mistral_large4_text": dict(_DEEPSEEK, index_n_heads=2, index_head_dim=16),
         "mistral_large4": dict(text_config=dict(_DEEPSEEK, index_n_heads=2, index_head_dim=16)),
         # DeepSeek-V4: heads, ranks, experts and the indexer made tiny (its class gives 512-wide heads)
         "deepseek_v4": dict(_SIZES, num_hidden_layers=4, head_dim=16, q_lora_rank=24, intermediate_size=16,
                             moe_intermediate_size=16,
                             n_routed_experts=8, o_groups=2, o_lora_rank=8, index_n_heads=2, index_head_dim=16),
         "stablelm": dict(_SIZES, num_key_value_heads=2),  # StableLmConfig's default is 32
         "glm4_moe": dict(_SIZES, num_key_value_heads=2, n_routed_experts=4, num_experts_per_tok=2),
         "qwen2_moe": dict(_SIZES, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2),
         "qwen3_moe": dict(_SIZES, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2),
         "gpt_oss": dict(_SIZES, num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2),
         "llama4_text": dict(_SIZES, num_key_value_heads=2, head_dim=8, num_hidden_layers=4, num_local_experts=4,
                             intermediate_size_mlp=64),
         "llama4": dict(text_config=dict(_SIZES, num_key_value_heads=2, head_dim=8, num_hidden_layers=4,
                                         num_local_experts=4, intermediate_size_mlp=64)),
         "phimoe": dict(_SIZES, num_key_value_heads=2, num_local_experts=4),
         # Gemma 4's class gives full layers 512-wide heads (refused): the file names them as wide as the others
         "gemma4_text": dict(_SIZES, num_key_value_heads=2, head_dim=8, global_head_dim=8),
         "gemma4": dict(text_config=dict(_SIZES, num_key_value_heads=2, head_dim=8, global_head_dim=8)),
         "kimi_k25": dict(text_config=dict(_DEEPSEEK, model_type="deepseek_v3")),
         # Kimi Linear: its latent attention and its delta attention's heads made tiny, five layers (the fifth full)
         "kimi_linear": dict(_SIZES, num_key_value_heads=4, num_hidden_layers=5, kv_lora_rank=12, qk_rope_head_dim=8,
                             qk_nope_head_dim=8, v_head_dim=12, moe_intermediate_size=16, num_experts=4,
                             num_experts_per_token=2, linear_head_dim=8, linear_num_heads=4),
         # Qwen3-Next and Qwen3.5: the linear layers' heads made tiny too
         **dict.fromkeys(("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"), _QWEN3_NEXT),
         **{wrapper: dict(text_config=_QWEN3_NEXT) for wrapper in ("qwen3_5", "qwen3_5_moe")},
         # CLIP's text model pools at its EOS id, which must lie in the vocabulary (the class's 49407 does not)
         "clip_text_model": dict(_SIZES, eos_token_id=2),
         **{dual: dict(text_config=dict(_SIZES, eos_token_id=2), vision_config=dict(
             {k: v for k, v in _SIZES.items() if k != "vocab_size"}, image_size=30, patch_size=10))
            for dual in ("clip", "siglip")},
         # image towers: no vocabulary, a 3 x 3 patch grid
         **dict.fromkeys(("vit", "clip_vision_model", "siglip_vision_model"), dict(
             {k: v for k, v in _SIZES.items() if k != "vocab_size"}, image_size=30, patch_size=10)),
         # SigLIP2's NaFlex tower: no vocabulary, a 4 x 4 grid of positions
         "siglip2_vision_model": dict({k: v for k, v in _SIZES.items() if k != "vocab_size"}, num_patches=16,
                                      patch_size=4),
         "siglip2": dict(text_config=_SIZES, vision_config=dict(
             {k: v for k, v in _SIZES.items() if k != "vocab_size"}, num_patches=16, patch_size=4)),
         "mistral3": dict(text_config=dict(_SIZES, num_key_value_heads=2, head_dim=8)),  # Mistral Small 3.1's text
         # LLaVA: a LLaMA text model, a CLIP tower of a 3 x 3 patch grid, the image placeholder in the vocabulary
         "llava": dict(text_config=dict(_SIZES, num_key_value_heads=2), image_token_index=96, vision_config=dict(
             {k: v for k, v in _SIZES.items() if k != "vocab_size"}, image_size=30, patch_size=10)),
         # Gemma 3 reading images: a SigLIP tower of a 3 x 3 patch grid pooled to one token, the image token in the
         # vocabulary
         "gemma3": dict(text_config=dict(_SIZES, num_key_value_heads=2, head_dim=8), image_token_index=96,
                        mm_tokens_per_image=1, vision_config=dict(
                            {k: v for k, v in _SIZES.items() if k != "vocab_size"}, image_size=30, patch_size=10)),
         # Qwen2.5-VL: M-RoPE's sections fitting an 8-wide head, a tower of two layers, the image token in the vocabulary
         "qwen2_5_vl": dict(text_config=dict(_SIZES, num_key_value_heads=2, bos_token_id=1, eos_token_id=2,
                                             rope_parameters=dict(rope_type="default", mrope_section=[1, 1, 2])),
                            image_token_id=96, vision_config=_QWEN2_5_VL_VISION),
         # the Qwen2-VL towers alone: no vocabulary (Qwen2-VL's sets its MLP by mlp_ratio, its output by hidden_size)
         "qwen2_5_vl_vision": _QWEN2_5_VL_VISION,
         "qwen2_vl_vision": dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4),
         # Llama 3.2 Vision: the text model's token ids in the vocabulary (the class's lie past it), one cross layer;
         # joined to a tiled tower of two layers and one global layer, tiles of 2 x 2 patches (alone: no vocabulary)
         "mllama_text_model": dict(_MLLAMA_TEXT), "mllama_vision_model": _MLLAMA_VISION,
         "mllama": dict(text_config=_MLLAMA_TEXT, image_token_index=97, vision_config=_MLLAMA_VISION),
         **dict.fromkeys(("llama", "mistral", "mixtral", "qwen2", "qwen3", "phi3", "glm", "glm4", "gemma2",
                          "gemma3_text"),
                         dict(_SIZES, num_key_value_heads=2, head_dim=8))}


@pytest.mark.parametrize("model_type", sorted(set(SUPPORTED) - {"t5gemma"}))  # T5Gemma: its halves are Gemma 2's
def test_a_file_that_leaves_keys_out_reads_as_the_whole_file_transformers_writes(model_type):
    """A file with only the sizes gives the ModelConfig of the file transformers' config class writes for
    it, every field spelled out: what a left-out key means is the class default, token ids included."""
    sizes = SIZES.get(model_type, _SIZES)
    whole = transformers.CONFIG_MAPPING[model_type](**sizes).to_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = config_from_hf({"model_type": model_type, **sizes})
        assert config_from_hf({**whole, "model_type": model_type}).replace(name=ours.name) == ours


def _published(source, folder, edit) -> str:
    """A copy of the checkpoint ``source`` whose config.json is rewritten by ``edit`` (as published)."""
    shutil.copytree(source, folder)
    hf = json.loads((folder / "config.json").read_text())
    edit(hf)
    (folder / "config.json").write_text(json.dumps(hf))
    return folder


def _matches_transformers(folder, tolerance=TOLERANCE, length=9):
    """Every layer, attention map and the logits against transformers' model of the same file, on an input
    longer than the test checkpoints' windows of 4, with padding."""
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 97, size=(2, length))
    mask = np.ones_like(ids)
    mask[1, length - 3:] = 0
    rows = compare(folder, ids, mask)
    assert all(r.max_abs <= tolerance for r in rows), format_table(rows, tolerance)


def _gemma3_as_published(hf: dict) -> None:
    """Gemma 3 files on the hub: no layer_types (sliding_window_pattern instead) and no rope_parameters
    (rope_theta and rope_scaling for the global layers, rope_local_base_freq for the local ones)."""
    assert hf.pop("layer_types") == ["sliding_attention", "sliding_attention", "full_attention"]
    rope = hf.pop("rope_parameters")
    hf.update(sliding_window_pattern=3, rope_theta=rope["full_attention"]["rope_theta"],
              rope_local_base_freq=rope["sliding_attention"]["rope_theta"],
              rope_scaling={"rope_type": "linear", "factor": rope["full_attention"]["factor"]})


@pytest.mark.parametrize("name, edit", [
    ("gemma3", _gemma3_as_published),
    ("gemma2", lambda hf: hf.pop("layer_types")),  # Gemma 2 files on the hub have no layer_types
], ids=["gemma3", "gemma2"])
def test_published_gemma_files_read_as_transformers_reads_them(name, edit, checkpoints, tmp_path):
    source = checkpoints(name)
    folder = _published(source, tmp_path / "published", edit)
    assert config_from_hf(json.loads((folder / "config.json").read_text())) == \
        config_from_hf(json.loads((source / "config.json").read_text()))
    _matches_transformers(folder)


def test_gemma3_without_any_rotary_keys_takes_the_class_bases():
    """No rope keys at all: global base 1e6, local base 1e4 (Gemma3TextConfig.default_theta)."""
    hf = {"model_type": "gemma3_text", "vocab_size": 97, "hidden_size": 32, "intermediate_size": 48,
          "num_hidden_layers": 6, "num_attention_heads": 4}
    cfg = config_from_hf(hf)
    assert (cfg.rotary.theta, cfg.rotary.local_theta, cfg.rotary.scaling) == (1e6, 1e4, None)
    assert cfg.layer_types == ("sliding",) * 5 + ("full",) and cfg.window_size == 4096
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.max_positions) == (4, 256, 131072)
    reference = transformers.Gemma3TextConfig.from_dict(hf)
    assert reference.rope_parameters["full_attention"]["rope_theta"] == cfg.rotary.theta
    assert reference.rope_parameters["sliding_attention"]["rope_theta"] == cfg.rotary.local_theta


def test_a_rope_scaling_entry_beside_rope_parameters_is_applied_as_transformers_does(checkpoints, tmp_path):
    """A transformers-5 file with a rope_scaling entry added (Qwen's documented long-context edit): the
    entry replaces rope_parameters whole, base included (the top-level rope_theta, else the default)."""
    def edit(hf):
        hf["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6}
        hf["rope_scaling"] = {"type": "linear", "factor": 4.0}

    folder = _published(checkpoints("llama"), tmp_path / "scaled", edit)
    cfg = jf.from_pretrained(folder).config
    reference = transformers.AutoConfig.from_pretrained(folder).rope_parameters
    assert cfg.rotary.scaling.kind == reference["rope_type"] == "linear"
    assert cfg.rotary.scaling.factor == reference["factor"] == 4.0 and cfg.rotary.theta == reference["rope_theta"]
    _matches_transformers(folder, length=40)


@pytest.mark.parametrize("changes, expected", [
    ({}, ("causal", None)),  # no window without use_sliding_window
    ({"use_sliding_window": True, "max_window_layers": 28}, ("causal", None)),  # layers from 28 on: none here
    ({"use_sliding_window": True, "max_window_layers": 0, "sliding_window": 5}, ("sliding", 5)),
    ({"use_sliding_window": True, "max_window_layers": 0}, ("sliding", 4096)),  # the class's window
])
def test_qwen2_layer_types_as_its_config_class_derives_them(changes, expected):
    hf = {"model_type": "qwen2", "vocab_size": 97, "hidden_size": 32, "intermediate_size": 48,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, **changes}
    cfg = config_from_hf(hf)
    assert (cfg.attention, cfg.window_size) == expected
    reference = transformers.Qwen2Config.from_dict(hf)
    assert set(reference.layer_types) == {"sliding_attention" if expected[0] == "sliding" else "full_attention"}
    with pytest.raises(ValueError, match="qwen2: a mix of sliding and full attention layers"):
        config_from_hf({**hf, "use_sliding_window": True, "max_window_layers": 1})


def test_keys_left_out_take_the_class_defaults():
    base = {"vocab_size": 97, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 8}
    mixtral = config_from_hf({"model_type": "mixtral", **base})
    assert (mixtral.rotary.theta, mixtral.num_kv_heads, mixtral.norms.eps, mixtral.experts.count,
            mixtral.experts.per_token) == (1e6, 8, 1e-5, 8, 2)
    mistral = config_from_hf({"model_type": "mistral", **base, "num_key_value_heads": 2})
    assert (mistral.attention, mistral.window_size) == ("sliding", 4096)
    assert config_from_hf({"model_type": "mistral", **base, "num_key_value_heads": 2,
                           "sliding_window": None}).attention == "causal"  # v0.3's explicit null
    gemma2 = config_from_hf({"model_type": "gemma2", **base})
    assert (gemma2.scores.softcap, gemma2.logits.softcap, gemma2.layer_types) == (50.0, 30.0, ("sliding", "full"))


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_configs_are_read_not_refused(name):
    """Every key of a published file (legacy keys, older versions' keys, generation defaults, remote-code
    settings) is read or harmless: none is refused by a reader that does not know it, and the generation
    defaults are named in a warning."""
    hf = PUBLISHED[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = config_from_hf(hf)
    generation = [str(w.message) for w in caught if "generation defaults" in str(w.message)]
    if name in ("bart-large",):
        # forced_eos_token_id=2 is not named: generate applies it, as transformers does
        assert "num_beams=4" in generation[0] and "forced_eos_token_id" not in generation[0]
    elif name.startswith(("m2m100", "nllb", "mbart")):  # their translation settings of the time
        assert "max_length=200" in generation[0]
        assert ("num_beams=5" in generation[0]) == (name != "nllb-200-distilled-600M")
    elif name in ("opus-mt-en-de", "pegasus-large"):  # beams and lengths named; bad words and forcing applied
        assert "num_beams" in generation[0] and "max_length" in generation[0]
        assert "bad_words_ids" not in generation[0] and "forced_eos_token_id" not in generation[0]
    else:
        assert not generation
    reference = transformers.CONFIG_MAPPING[hf["model_type"]].from_dict(hf)
    assert cfg.num_heads == reference.num_attention_heads and cfg.vocab_size == reference.vocab_size


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_a_published_file_and_its_transformers_5_form_read_the_same(name):
    """The published file and the file transformers 5 writes after loading it (legacy keys moved into
    rope_parameters and layer_types, class defaults spelled out) give one ModelConfig."""
    hf = copy.deepcopy(PUBLISHED[name])
    reference = transformers.CONFIG_MAPPING[hf["model_type"]].from_dict(copy.deepcopy(hf))
    rewritten = json.loads(reference.to_json_string(use_diff=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        published, modern = config_from_hf(hf), config_from_hf(rewritten)
    assert modern.replace(name=published.name) == published


def test_a_published_multimodal_llama4_file_reads_as_its_transformers_form():
    """Scout as published: a Llama4ForConditionalGeneration file whose text_config says
    attn_temperature_tuning=4 (transformers' strict class refuses the integer; read as on) and no_rope_layers=[]
    (every fourth layer without rotary positions, as the class derives it); sizes made tiny."""
    text = {"_attn_implementation_autoset": True, "attention_bias": False, "attention_chunk_size": 8192,
            "attention_dropout": 0.0, "attn_scale": 0.1, "attn_temperature_tuning": 4, "bos_token_id": 200000,
            "eos_token_id": [200001, 200007, 200008], "floor_scale": 8192, "for_llm_compressor": False, "head_dim": 8,
            "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02, "interleave_moe_layer_step": 1,
            "intermediate_size": 16, "intermediate_size_mlp": 48, "max_position_embeddings": 10485760,
            "model_type": "llama4_text", "no_rope_layers": [], "num_attention_heads": 4, "num_experts_per_tok": 1,
            "num_hidden_layers": 4, "num_key_value_heads": 2, "num_local_experts": 4, "output_router_logits": False,
            "pad_token_id": 200018, "rms_norm_eps": 1e-05,
            "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
            "torch_dtype": "bfloat16", "use_cache": True, "use_qk_norm": True, "vocab_size": 202048}
    published = {"architectures": ["Llama4ForConditionalGeneration"], "boi_token_index": 200080,
                 "eoi_token_index": 200081, "image_token_index": 200092, "model_type": "llama4", "text_config": text,
                 "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0.dev0",
                 "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 16, "num_hidden_layers": 1}}
    cfg = config_from_hf(copy.deepcopy(published))
    assert (cfg.nope.layers, cfg.nope.temperature_floor_scale, cfg.layer_types) == (
        (3,), 8192, ("chunked", "chunked", "chunked", "full"))
    assert (cfg.vocab_size, cfg.tokens.eos, cfg.tokens.pad) == (202048, (200001, 200007, 200008), 200018)
    accepted = copy.deepcopy(published)
    accepted["text_config"]["attn_temperature_tuning"] = True
    reference = transformers.CONFIG_MAPPING["llama4"].from_dict(accepted)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        modern = config_from_hf(json.loads(reference.to_json_string(use_diff=False)))
    assert modern.replace(name=cfg.name) == cfg


def test_a_published_deepseek_v32_file_reads_with_its_fp8_weights_and_without_them():
    """DeepSeek-V3.2 as published (sizes tiny): its block-scaled fp8 weights load decoded (interop/fp8.py), so the
    file reads as the same file without its quantization_config (a bfloat16 conversion), and as its transformers
    form, with the remote code's keys (scoring_func, topk_method, moe_layer_freq, ep_size) and the MTP layer count
    read or harmless."""
    published = {"architectures": ["DeepseekV32ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                 "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 1, "hidden_act": "silu",
                 "hidden_size": 32, "index_head_dim": 16, "index_n_heads": 2, "index_topk": 2048,
                 "initializer_range": 0.02, "intermediate_size": 48, "kv_lora_rank": 12, "max_position_embeddings": 163840,
                 "model_type": "deepseek_v32", "moe_intermediate_size": 16, "moe_layer_freq": 1, "n_group": 2,
                 "n_routed_experts": 8, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 4,
                 "num_experts_per_tok": 2, "num_hidden_layers": 3, "num_key_value_heads": 4,
                 "num_nextn_predict_layers": 1, "q_lora_rank": 20, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
                 "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                         "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
                 "rms_norm_eps": 1e-06,
                 "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                                  "original_max_position_embeddings": 4096, "type": "yarn"},
                 "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
                 "tie_word_embeddings": False, "topk_group": 1, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
                 "transformers_version": "4.44.2", "use_cache": True, "v_head_dim": 12, "vocab_size": 97}
    converted = {k: v for k, v in published.items() if k != "quantization_config"}
    cfg = config_from_hf(copy.deepcopy(converted))
    assert config_from_hf(copy.deepcopy(published)) == cfg
    assert (cfg.indexer.heads, cfg.indexer.head_dim, cfg.indexer.topk, cfg.experts.dense_layers) == (2, 16, 2048, 1)
    reference = transformers.CONFIG_MAPPING["deepseek_v32"].from_dict(copy.deepcopy(converted))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        modern = config_from_hf(json.loads(reference.to_json_string(use_diff=False)))
    assert modern.replace(name=cfg.name) == cfg


def _signature_defaults(model_type: str) -> dict:
    """Every field of the config class at the default its constructor takes (what a file that writes each key
    at its default says), JSON values only."""
    import inspect

    cls = getattr(transformers, CLASSES[model_type]) if model_type in CLASSES else \
        transformers.CONFIG_MAPPING[model_type]
    out = {}
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if name != "self" and parameter.default is not inspect.Parameter.empty:
            try:
                json.dumps(parameter.default, allow_nan=False)
            except (TypeError, ValueError):
                continue
            out[name] = parameter.default
    return out


@pytest.mark.parametrize("model_type", sorted(set(SUPPORTED) - {"t5gemma", "llama4", "kimi_k25"}))
def test_every_key_of_the_config_class_written_at_its_default_loads(model_type):
    """The converse of the key-by-key test: a file that spells out every field of its config class at the
    class's default (beside the sizes it must give) loads, to the config of the file that leaves them out.
    (T5Gemma's, Llama 4's and Kimi K2.5's fields are sub-configs, read as their halves' and text model's.)"""
    sizes = SIZES.get(model_type, _SIZES)
    spelled = {**_signature_defaults(model_type), **sizes, "model_type": model_type}
    spelled.pop("architectures", None)  # None: the class's default head
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert config_from_hf(spelled) == config_from_hf({"model_type": model_type, **sizes})


@pytest.mark.parametrize("model_type, key, value", [
    ("qwen2", "use_mrope", True),  # Qwen2-VL's; Qwen2Config never reads it, whatever its value
    ("llama", "rope_interleaved", True),  # nanotron's; LlamaConfig never reads it
    ("openai-gpt", "n_special", 5),  # the original release's; the token table's shape gives the vocabulary
])
def test_a_key_transformers_never_reads_changes_nothing_there_either(model_type, key, value, checkpoints, tmp_path):
    """A key the class never reads loads at any value, and transformers' numbers do not move with it."""
    name = {"qwen2": "qwen2", "llama": "llama", "openai-gpt": "openai-gpt"}[model_type]
    folder = _published(checkpoints(name), tmp_path / "published", lambda hf: hf.update({key: value}))
    assert config_from_hf(json.loads((folder / "config.json").read_text())) == \
        config_from_hf(json.loads((checkpoints(name) / "config.json").read_text()))
    _matches_transformers(folder)


def test_a_key_transformers_reads_is_harmless_only_at_its_default():
    """The rule's other side, on the generated facts: a key transformers' class reads changes nothing only at
    the class's default (Qwen2's use_sliding_window), and a class the facts do not know assumes nothing."""
    from jaxformer.interop.reference_keys import harmless_reason

    assert "defaults to" in harmless_reason("qwen2", "use_sliding_window", False)
    assert harmless_reason("qwen2", "use_sliding_window", True) is None
    assert "never reads" in harmless_reason("qwen2", "use_mrope", True)
    assert harmless_reason("no_such_type", "anything", 1) is None


def test_the_facts_about_transformers_keys_are_those_of_the_installed_transformers():
    """reference_keys.json against what the installed transformers reads and defaults to, for every key of the
    published files above and every supported model type (a transformers upgrade that starts reading a key
    the facts call unread is a silent drop: regenerate with ``python -m jaxformer.interop.reference_keys``)."""
    from jaxformer.interop import reference_keys

    stored = reference_keys.facts()
    assert set(SUPPORTED) <= set(stored["types"])
    live = reference_keys.generate(sorted(SUPPORTED))
    keys = {key for hf in PUBLISHED.values() for key in hf} | {key for t in live["types"].values() for key in t["defaults"]}
    for model_type, table in live["types"].items():
        ours = stored["types"][model_type]
        for key in keys:
            read = key in table["reads"] or key in live["common_reads"]
            assert read == (key in ours["reads"] or key in stored["common_reads"]), (model_type, key)
            assert reference_keys.same_value(table["defaults"].get(key, "-"), ours["defaults"].get(key, "-")), (model_type, key)


def test_an_export_without_token_ids_does_not_take_transformers_class_defaults(tmp_path):
    """A model with no bos/eos id (a bytes-vocabulary run) writes them as null: left out, GPT2Config would fill
    in 50256, outside a 256-token vocabulary."""
    cfg = jf.config("tiny-gpt").replace(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    jf.build(cfg, seed=0).save_pretrained(tmp_path)
    reference = transformers.AutoConfig.from_pretrained(tmp_path)
    assert reference.model_type == "gpt2"
    assert (reference.bos_token_id, reference.eos_token_id) == (None, None)


def test_a_t5gemma_file_without_token_ids_takes_its_decoders_as_transformers_does():
    """T5GemmaConfig fills each id its file leaves out from its decoder's (class defaults pad 0, eos 1, bos 2),
    and generation starts decoding from bos: a file without ids decodes from 2, not from nothing."""
    half = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                num_hidden_layers=2, vocab_size=97)
    file = transformers.T5GemmaConfig(encoder=half, decoder=half).to_dict()
    for side in (file, file["encoder"], file["decoder"]):
        for key in ("bos_token_id", "pad_token_id", "eos_token_id", "decoder_start_token_id"):
            side.pop(key, None)
    reference = transformers.T5GemmaConfig.from_dict(file)
    tokens = config_from_hf({**file, "architectures": ["T5GemmaForConditionalGeneration"]}).tokens
    assert (tokens.pad, tokens.eos, tokens.bos, tokens.decoder_start) == (
        reference.pad_token_id, reference.eos_token_id, reference.bos_token_id, reference.bos_token_id) == (0, 1, 2, 2)
