"""PEFT LoRA adapters: loaded onto the Hugging Face base with PEFT's logits (float32, 1e-5), written back in
PEFT's format that PeftModel loads with the same logits, merged as merge_and_unload merges, and every
adapter or option jaxformer cannot reproduce refused by name."""

from __future__ import annotations

import copy
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer.layers.weights import LoraParam

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from hf_factory import build_reference

TOL = 1e-5
LLAMA_ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# case -> (checkpoint, LoraConfig fields); every adapter has random (not zero) B
CASES = {
    "llama-all": ("llama", dict(r=4, lora_alpha=8, target_modules=LLAMA_ALL)),
    # rsLoRA, a per-module rank and alpha, one layer of two: padded, rescaled and zero factors
    "llama-rslora-patterns": ("llama", dict(r=4, lora_alpha=8, use_rslora=True, target_modules=["q_proj", "v_proj", "down_proj"],
                                            rank_pattern={"v_proj": 6}, alpha_pattern={"down_proj": 3}, layers_to_transform=[1])),
    "gpt2-c_attn": ("gpt2", dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True)),
    "bert-classifier": ("bert-seqcls", dict(r=4, lora_alpha=8, target_modules=["query", "value"], task_type="SEQ_CLS")),
    "distilbert-classifier": ("distilbert-seqcls", dict(r=4, lora_alpha=8, target_modules=["q_lin", "v_lin", "lin1"],
                                                        task_type="SEQ_CLS")),
    # XLM-R token classification (NER's usual encoder): attention and MLP projections
    "xlm-roberta-tokens": ("xlm-roberta-tokcls", dict(r=4, lora_alpha=8, target_modules=["query", "value", "dense"],
                                                      task_type="TOKEN_CLS")),
    # ALBERT: the one shared layer's projections (one adapter serves every layer), ELECTRA's discriminator
    "albert-shared-layer": ("albert-seqcls", dict(r=4, lora_alpha=8, target_modules=["query", "value", "ffn"],
                                                  task_type="SEQ_CLS")),
    "electra-discriminator": ("electra-discriminator", dict(r=4, lora_alpha=8,
                                                            target_modules=["query", "key", "intermediate.dense"])),
    # ModernBERT: fused Wqkv (one A for the three, B split by q, k, v) and fused Wi (B split by gate and up)
    "modernbert-fused": ("modernbert-tokcls", dict(r=4, lora_alpha=8, target_modules=["Wqkv", "Wo", "Wi"],
                                                   task_type="TOKEN_CLS")),
    # DeBERTa-v3: query_proj and key_proj also project the relative-position table (share_att_key), so the
    # adapters reach the position terms too; v1's fused in_proj with its separate position projections
    "deberta-v3-shared-key": ("deberta-v2-tokcls", dict(r=4, lora_alpha=8, target_modules=["query_proj", "key_proj",
                                                                                          "value_proj", "dense"],
                                                        task_type="TOKEN_CLS")),
    "t5-q-v": ("t5", dict(r=4, lora_alpha=16, target_modules=["q", "v"])),
    # latent attention: the query's down and up projections, the shared key-value latent, the output
    "deepseek-mla": ("deepseek-v2", dict(r=4, lora_alpha=8, target_modules=["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa",
                                                                             "o_proj"])),
}


def _ids(seed=0):
    return np.random.RandomState(seed).randint(3, 97, size=(2, 7))


def _torch_logits(model, ids, encoder_decoder):
    extra = {"decoder_input_ids": torch.tensor(ids[:, :5])} if encoder_decoder else {}
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), **extra).logits.numpy()


def _jax_logits(model, ids):
    extra = {"decoder_input_ids": jnp.asarray(ids[:, :5])} if model.config.family == "encoder_decoder" else {}
    return np.asarray(model(jnp.asarray(ids), **extra).logits)


@pytest.fixture(scope="module")
def case(checkpoints, tmp_path_factory):
    """``case(name)``: (base folder, adapter folder, the torch reference, PEFT's logits, base logits)."""
    cache = {}

    def get(name):
        if name not in cache:
            checkpoint, fields = CASES[name]
            base = checkpoints(checkpoint)
            reference = build_reference(checkpoint)
            ids, enc_dec = _ids(), checkpoint.startswith("t5")
            plain = _torch_logits(reference, ids, enc_dec)
            torch.manual_seed(1)
            model = peft.get_peft_model(copy.deepcopy(reference), peft.LoraConfig(init_lora_weights=False, **fields)).eval()
            folder = tmp_path_factory.mktemp(f"adapter-{name}")
            model.save_pretrained(str(folder))
            cache[name] = (base, folder, model, _torch_logits(model, ids, enc_dec), plain)
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(CASES))
def test_adapter_matches_peft_and_round_trips(case, tmp_path, name):
    base, folder, _, want, plain = case(name)
    assert np.abs(want - plain).max() > 1e-2, "the adapter should change the logits"
    ours = jf.from_pretrained(base, adapter=folder)
    got = _jax_logits(ours, _ids())
    assert np.abs(got - want).max() < TOL
    ours.save_adapter(tmp_path)
    reloaded = peft.PeftModel.from_pretrained(build_reference(CASES[name][0]), str(tmp_path)).eval()
    again = _torch_logits(reloaded, _ids(), name.startswith("t5"))
    assert np.abs(again - got).max() < TOL
    if name == "bert-classifier":  # the head trains in full and goes out as modules_to_save
        assert ours.config.lora.trainable == ("classifier/kernel", "classifier/bias")
        assert json.loads((tmp_path / "adapter_config.json").read_text())["modules_to_save"] == ["classifier"]
    if name.startswith("gpt2"):
        assert json.loads((tmp_path / "adapter_config.json").read_text())["fan_in_fan_out"] is True


@pytest.mark.parametrize("trained, rank", [("qkv", 12), ("q", 4)])
def test_gpt2_trained_qkv_adapters_go_out_through_c_attn(case, tmp_path, trained, rank):
    """Three different A's on q, k, v (trained here) cannot share c_attn's one A: they go out as rank 3R with a
    block-diagonal B; with only q's B nonzero, q's A is c_attn's. PEFT (and jaxformer again) computes the same
    logits."""
    base, folder, _, _, _ = case("gpt2-c_attn")
    lora = jf.from_pretrained(base, adapter=folder)  # q, k, v share c_attn's A until trained
    rng = np.random.RandomState(3)
    state = jax.tree.map(lambda v: jnp.asarray(rng.normal(0, 0.3, v.shape), v.dtype), nnx.state(lora, LoraParam))
    for name in set("qkv") - set(trained):
        state["decoder"]["blocks"]["attn"][f"{name}_lora"]["b"][...] = 0.0
    nnx.update(lora, state)
    want = _jax_logits(lora, _ids())
    lora.save_adapter(tmp_path)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    patterns = ({"c_attn": 12}, {"c_attn": 24.0}) if rank == 12 else ({}, {})
    assert (config["r"], config["rank_pattern"], config["alpha_pattern"]) == (4, *patterns)
    reloaded = peft.PeftModel.from_pretrained(build_reference("gpt2"), str(tmp_path)).eval()
    assert np.abs(_torch_logits(reloaded, _ids(), False) - want).max() < TOL
    back = jf.from_pretrained(base, adapter=tmp_path)
    assert back.config.lora.rank == rank
    assert np.abs(_jax_logits(back, _ids()) - want).max() < TOL


def test_merged_export_equals_merge_and_unload(case, tmp_path):
    base, folder, model, _, _ = case("llama-all")
    jf.from_pretrained(base, adapter=folder).merge_adapter().save_pretrained(tmp_path)
    ours = safetensors_numpy.load_file(str(tmp_path / "model.safetensors"))
    theirs = {k: v.numpy() for k, v in copy.deepcopy(model).merge_and_unload().state_dict().items()}
    assert set(ours) == set(theirs)
    assert max(np.abs(ours[k] - theirs[k]).max() for k in ours) < 1e-6


def test_int8_base_under_the_adapter(case, tmp_path):
    base, folder, _, want, _ = case("llama-all")
    ours = jf.from_pretrained(base, adapter=folder, quantize="int8")
    assert (ours.config.quantization.kind, ours.config.lora.rank) == ("int8", 4)
    got = _jax_logits(ours, _ids())
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    ours.save_adapter(tmp_path)  # QLoRA: the float adapter of an int8 base goes out as it is
    assert np.array_equal(safetensors_numpy.load_file(str(tmp_path / "adapter_model.safetensors"))[
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"],
        safetensors_numpy.load_file(str(folder / "adapter_model.safetensors"))[
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"])


def _edited(case, tmp_path, config=None, tensors=None):
    base, folder, _, _, _ = case("llama-all")
    shutil.copytree(folder, tmp_path / "adapter")
    if config:
        path = tmp_path / "adapter" / "adapter_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    if tensors:
        path = tmp_path / "adapter" / "adapter_model.safetensors"
        safetensors_numpy.save_file(tensors(safetensors_numpy.load_file(str(path))), str(path))
    return base, tmp_path / "adapter"


KEY = "base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"


@pytest.mark.parametrize("edit, message", [
    (dict(config={"use_dora": True}), "use_dora=true"),
    (dict(config={"bias": "all"}), 'bias="all"'),
    (dict(config={"init_lora_weights": "pissa"}), "init_lora_weights"),
    (dict(config={"target_modules": ["q_proj", "embed_tokens"]}), "model.embed_tokens: not a projection"),
    (dict(tensors=lambda t: {k: v for k, v in t.items() if k != KEY}), f"missing tensors (1): ['{KEY}']"),
    (dict(tensors=lambda t: {**t, "base_model.model.lm_head.lora_A.weight": t[KEY]}), "unexpected tensors (1)"),
    (dict(tensors=lambda t: {**t, KEY: t[KEY][:, :3]}), "mis-shaped tensors (1)"),
])
def test_unsupported_adapters_are_refused_by_name(case, tmp_path, edit, message):
    base, folder = _edited(case, tmp_path, **edit)
    with pytest.raises(ValueError, match="nothing was loaded|does not support|cannot adapt") as err:
        jf.from_pretrained(base, adapter=folder)
    assert message in str(err.value)


def test_other_adapter_types_are_refused(checkpoints, tmp_path):
    model = peft.get_peft_model(build_reference("llama"), peft.IA3Config(target_modules=["k_proj", "down_proj"],
                                                                       feedforward_modules=["down_proj"]))
    model.save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="peft_type 'IA3' is not supported"):
        jf.from_pretrained(checkpoints("llama"), adapter=tmp_path)
