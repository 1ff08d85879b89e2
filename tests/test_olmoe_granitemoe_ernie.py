"""OLMoE (``olmoe``), Granite MoE (``granitemoe``) and ERNIE 4.5 (``ernie4_5``) as transformers computes them:
files as published read as their transformers-5 form and match transformers' numbers; settings jaxformer cannot
honour are refused by name;
greedy and beam generation with left padding are token-identical; a QLoRA fine-tune starts from each file and
learns. Parity of every layer and the bit-exact round trip of the tiny checkpoints are in test_hf_parity.py,
every key changed one at a time in test_config_keys.py, the presets' counts against transformers' in
test_presets.py, cache == no cache in test_generate.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxformer.interop.hf import config_from_hf  # noqa: E402

from family_files import (TINY, as_transformers_writes_it, generates_as_transformers,  # noqa: E402
                          matches_transformers, qlora_loss_falls, read, rewritten)

# The published config.json files, every key kept, sizes (and token ids) those of the tiny checkpoints; the
# experts 4 (top 2) as in the tiny files. Granite MoE's head is untied here as the tiny file's is.
PUBLISHED = {
    # allenai/OLMoE-1B-7B-0924
    "olmoe": {"architectures": ["OlmoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "clip_qkv": None, "eos_token_id": 2, "hidden_act": "silu", "model_type": "olmoe",
              "norm_topk_prob": False, "num_experts": 4, "num_experts_per_tok": 2, "output_router_logits": False,
              "pad_token_id": 0, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0,
              "router_aux_loss_coef": 0.01, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "transformers_version": "4.43.0.dev0", "use_cache": True, **TINY},
    # ibm-granite/granite-3.0-1b-a400m-base
    "granitemoe": {"architectures": ["GraniteMoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.1,
                   "attention_multiplier": 0.015625, "bos_token_id": 1, "embedding_multiplier": 12.0,
                   "eos_token_id": 2, "hidden_act": "silu", "logits_scaling": 6.0, "model_type": "granitemoe",
                   "num_experts_per_tok": 2, "num_local_experts": 4, "output_router_logits": False,
                   "pad_token_id": 0, "residual_multiplier": 0.22, "rms_norm_eps": 1e-06, "rope_scaling": None,
                   "rope_theta": 10000.0, "router_aux_loss_coef": 0.001, "tie_word_embeddings": False,
                   "torch_dtype": "bfloat16", "transformers_version": "4.45.0.dev0", "use_cache": True, **TINY},
    # baidu/ERNIE-4.5-0.3B-PT (its own head_dim as the tiny file's)
    "ernie4_5": {"architectures": ["Ernie4_5ForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "head_dim": 12,
                 "hidden_act": "silu", "model_type": "ernie4_5", "pad_token_id": 0, "rms_norm_eps": 1e-05,
                 "rope_theta": 500000, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_bias": False,
                 "use_cache": False, **TINY},
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_published_file_reads_as_its_transformers_5_form_and_matches_transformers(name, checkpoints, tmp_path):
    cfg = read(PUBLISHED[name])
    assert read(as_transformers_writes_it(PUBLISHED[name])).replace(name=cfg.name) == cfg
    matches_transformers(rewritten(checkpoints(name), tmp_path / "published", PUBLISHED[name]))


def test_what_the_published_files_say():
    olmoe, granite = read(PUBLISHED["olmoe"]), read(PUBLISHED["granitemoe"])
    assert (olmoe.query_key_norm.span, olmoe.experts.count, olmoe.experts.per_token) == ("projection", 4, 2)
    assert not olmoe.experts.normalize_weights and olmoe.expert_width == olmoe.d_ff == 48
    assert (granite.experts.count, granite.experts.normalize_weights, granite.logits.divisor) == (4, True, 6.0)
    ernie = read(PUBLISHED["ernie4_5"])
    assert (ernie.rotary.interleave, ernie.rope_dim, ernie.rotary.theta, ernie.embeddings.tie) == (True, 12, 5e5, True)
    # LLaMA's bias keys are not ERNIE's: transformers' ERNIE never reads them
    assert read({**PUBLISHED["ernie4_5"], "attention_bias": True, "mlp_bias": True}) == ernie


@pytest.mark.parametrize("name, changes, message", [
    ("olmoe", {"clip_qkv": 8.0}, "olmoe: clip_qkv=8.0"),
    ("olmoe", {"num_experts": 0}, "olmoe: num_experts=0"),
    ("granitemoe", {"num_local_experts": 0}, "granitemoe: num_local_experts=0"),
    ("ernie4_5", {"use_bias": True}, "ernie4_5: use_bias=True"),
])
def test_a_setting_jaxformer_cannot_honour_is_refused_by_name(name, changes, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**PUBLISHED[name], **changes})


@pytest.mark.parametrize("name", ["olmoe", "granitemoe", "ernie4_5"])
def test_generation_is_token_identical_to_transformers(name, checkpoints):
    generates_as_transformers(checkpoints(name))


# Granite's multipliers slow its adapters' effect on the loss (see test_granite_smollm3_stablelm.py)
@pytest.mark.parametrize("name, lr", [("olmoe", 2e-2), ("granitemoe", 8e-2), ("ernie4_5", 2e-2)])
def test_a_qlora_fine_tune_starts_from_the_file_and_its_loss_falls(name, lr, checkpoints, tmp_path):
    qlora_loss_falls(checkpoints(name), tmp_path, f"optim.lr={lr}")
