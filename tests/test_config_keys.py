"""No config.json key that changes the numbers is dropped: each key of every supported architecture's
tiny checkpoint, changed one at a time to another value, either changes the ModelConfig jaxformer
derives, or is refused at load, or leaves transformers' own logits unchanged (a torch forward of the
changed config over the same weights; no JAX compile). A key that changed transformers' numbers and
nothing of jaxformer's is exactly the silent drop this guards against."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxformer.interop.hf import config_from_hf  # noqa: E402
from jaxformer.interop.registry import BY_MODEL_TYPE  # noqa: E402
from jaxformer.interop.rules import GENERATION_KEYS, HARMLESS  # noqa: E402

from hf_factory import (AUDIO_SHAPES, DUAL_ENCODERS, IMAGE_SIZES, NAFLEX, merged_images, naflex_images,  # noqa: E402
                        tiled_images, transformers_class)

# One tiny checkpoint per model_type, with its LM head where it has one (hf_factory's names).
CHECKPOINTS = {"bert": "bert-mlm", "distilbert": "distilbert-mlm", "albert": "albert-mlm",
               "electra": "electra-generator", "modernbert": "modernbert-mlm", "deberta": "deberta-mlm",
               "deberta-v2": "deberta-v2-conv", "roberta": "roberta-mlm", "xlm-roberta": "xlm-roberta-mlm", "gpt2": "gpt2", "llama": "llama", "mistral": "mistral",
               "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3-longrope", "gpt_neo": "gpt-neo",
               "openai-gpt": "openai-gpt", "qwen2_moe": "qwen2-moe", "qwen3_moe": "qwen3-moe",
               "gpt_neox": "gpt-neox", "gptj": "gptj", "glm": "glm", "glm4": "glm4", "opt": "opt",
               "mixtral": "mixtral", "gpt_oss": "gpt-oss", "llama4_text": "llama4",
               "deepseek_v2": "deepseek-v2", "deepseek_v3": "deepseek-v3",
               "deepseek_v32": "deepseek-v32", "glm_moe_dsa": "glm_moe_dsa",
               "gemma2": "gemma2", "gemma3_text": "gemma3", "gemma4_text": "gemma4-moe", "t5": "t5", "mt5": "mt5", "umt5": "umt5", "mpnet": "mpnet-mlm",
               "bart": "bart", "m2m_100": "m2m100", "mbart": "mbart", "marian": "marian", "pegasus": "pegasus", "t5gemma": "t5gemma",
               "xlnet": "xlnet", "starcoder2": "starcoder2", "olmo2": "olmo2", "granite": "granite",
               "smollm3": "smollm3", "stablelm": "stablelm-12b", "falcon": "falcon-40b",
               "cohere": "cohere-qk-norm", "cohere2": "cohere2", "olmoe": "olmoe", "granitemoe": "granitemoe",
               "ernie4_5": "ernie4_5", "glm4_moe": "glm4_moe", "longformer": "longformer-mlm",
               "big_bird": "big_bird-mlm", "bigbird_pegasus": "bigbird_pegasus",
               "phimoe": "phimoe", "qwen3_next": "qwen3_next", "qwen3_5_text": "qwen3_5",
               "qwen3_5_moe_text": "qwen3_5_moe", "mistral4": "mistral4", "kimi_linear": "kimi_linear",
               "deepseek_v4": "deepseek-v4", "mistral_large4_text": "mistral_large4"}
CHECKPOINTS.update(vit="vit-imgcls", clip_vision_model="clip_vision_model", siglip_vision_model="siglip_vision_model")
CHECKPOINTS.update(clip="clip", clip_text_model="clip_text_model", siglip="siglip",
                   siglip_text_model="siglip_text_model")
CHECKPOINTS.update(siglip2="siglip2", siglip2_text_model="siglip2_text_model",
                   siglip2_vision_model="siglip2_vision_model")
CHECKPOINTS["llava"] = "llava"
CHECKPOINTS["gemma3"] = "gemma3-vision"  # (fed one image: its placeholder, id 96, and its token type)
CHECKPOINTS["qwen2_5_vl"] = "qwen2_5_vl"
CHECKPOINTS["mllama_vision_model"] = "mllama_vision_model"  # (hf_factory.TILED_TOWERS)
CHECKPOINTS.update(qwen2_5_vl_vision="qwen2_5_vl_vision", qwen2_vl_vision="qwen2_vl_vision")  # (MERGED_TOWERS)
CHECKPOINTS["whisper"] = "whisper"
# Llama 3.2 Vision's text model and the joined file, fed text alone (tests/test_mllama.py feeds images)
CHECKPOINTS.update(mllama_text_model="mllama_text_model", mllama="mllama")
# Changed string values: another valid choice where the key has choices, so the change means something.
OTHER_STRING = {"gelu": "relu", "relu": "gelu", "silu": "gelu", "gelu_new": "relu", "gelu_pytorch_tanh": "silu",
                "float32": "bfloat16", "gated-gelu": "relu", "absolute": "relative_key", "uni": "bi",
                "last": "first", "tanh": "relu", "greedy": "group_limited_greedy", "noaux_tc": "greedy",
                "sliding_attention": "full_attention", "full_attention": "sliding_attention"}


def _changed(key: str, value):
    """Another value of the same kind, or None when there is no sensible other value to try."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 + 0.25
    if isinstance(value, str):
        return OTHER_STRING.get(value, value + "_other")
    if value is None:
        return 3.0 if key.endswith(("softcapping", "_scale", "factor")) else 2
    if isinstance(value, list) and value:
        return [_changed(key, value[0]), *value[1:]]
    if isinstance(value, dict) and "rope_theta" in value:
        return {**value, "rope_theta": value["rope_theta"] * 2}
    if isinstance(value, dict) and key in ("id2label", "label2id"):
        return {**value, "extra": 9} if key == "label2id" else {**value, "9": "extra"}
    return None


def _keys(hf: dict, prefix: str = ""):
    for key, value in hf.items():
        if isinstance(value, dict) and "model_type" in value:  # a sub-config (T5Gemma's halves)
            yield from _keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _with(hf: dict, path: str, value) -> dict:
    out = json.loads(json.dumps(hf))
    *parents, last = path.split(".")
    node = out
    for part in parents:
        node = node[part]
    node[last] = value
    return out


REFUSED = "transformers refuses it"


def _torch_logits(arch: str, hf: dict, source, folder, ids, encoder_decoder: bool, tied: set[str] | None = None):
    """(transformers' logits (or last hidden state) of config ``hf`` over the weights of ``source``, the
    parameters the file does not hold: tied ones), loaded as from_pretrained loads a folder (``folder``:
    the changed config.json beside a link to the weights). REFUSED when transformers cannot build, load
    or run it (no real file says that); None when the changed config holds other parameters than the
    original (``tied``): a changed structure, which changes the numbers."""
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf))
    if not (folder / "model.safetensors").exists():
        (folder / "model.safetensors").symlink_to(source / "model.safetensors")
    try:
        model, info = transformers_class(arch).from_pretrained(folder, attn_implementation="eager",
                                                               output_loading_info=True)
        missing = set(info["missing_keys"])
        if info["unexpected_keys"] or (tied is not None and missing != tied):
            return None
        with torch.no_grad():
            # (an image tower's: pixels; a dual encoder's: both, as a dict)
            inputs = ids if isinstance(ids, dict) else {"pixel_values": ids} if ids.dim() == 4 else {"input_ids": ids}
            decoder = {"decoder_input_ids": ids} if encoder_decoder and not isinstance(ids, dict) else {}
            out = model.eval()(**inputs, **decoder)
    except Exception:  # noqa: BLE001 - whatever transformers refuses is no file a user has
        return REFUSED
    if hasattr(out, "logits_per_image"):
        return out.logits_per_image.numpy(), missing
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy(), missing


# Model types whose keys another entry covers: a multimodal Llama 4 file's text_config is llama4_text's, read by
# the same code (and its load is tested in test_family_tree.py); its own keys are the vision tower's.
COVERED_BY = {"llama4": "llama4_text"}
# Kimi K2.5's file: its text_config is deepseek_v3's (tests/test_phimoe_kimi.py loads it)
COVERED_BY["kimi_k25"] = "deepseek_v3"
# Gemma 4's multimodal file: its text_config is gemma4_text's (tests/test_gemma4.py loads it); the rest the towers'
COVERED_BY["gemma4"] = "gemma4_text"
# Qwen3.5's multimodal files: their text_config is qwen3_5_text's / qwen3_5_moe_text's (tests/test_qwen3_next.py)
COVERED_BY.update(qwen3_5="qwen3_5_text", qwen3_5_moe="qwen3_5_moe_text")
# Mistral 3's multimodal files: their text_config is mistral's or mistral4's (tests/test_mistral3.py loads both)
COVERED_BY["mistral3"] = "mistral"
# Mistral Large 4's multimodal file: its text_config is mistral_large4_text's (tests/test_mistral_large4.py loads it)
COVERED_BY["mistral_large4"] = "mistral_large4_text"


@pytest.mark.parametrize("model_type", sorted(CHECKPOINTS))
def test_every_key_is_read_refused_or_harmless(model_type, checkpoints, tmp_path):
    assert set(CHECKPOINTS) | set(COVERED_BY) == set(BY_MODEL_TYPE)  # a new architecture joins this test
    source = checkpoints(CHECKPOINTS[model_type])
    hf = json.loads((source / "config.json").read_text())
    arch = hf["architectures"][0]
    ids = torch.as_tensor(np.random.default_rng(0).integers(3, 90, (1, 9)))
    if CHECKPOINTS[model_type] in IMAGE_SIZES:
        pixels = torch.as_tensor(np.random.default_rng(0).standard_normal((1, *IMAGE_SIZES[CHECKPOINTS[model_type]])),
                                 dtype=torch.float32)
        ids = dict(input_ids=ids, pixel_values=pixels) if CHECKPOINTS[model_type] in DUAL_ENCODERS else pixels
    if CHECKPOINTS[model_type] in NAFLEX:  # patched images with their mask and grids
        images = {key: torch.as_tensor(value) for key, value in naflex_images(CHECKPOINTS[model_type],
                                                                              np.random.default_rng(0)).items()}
        ids = dict(input_ids=ids.expand(2, -1), **images) if CHECKPOINTS[model_type] in DUAL_ENCODERS else images
    if model_type == "llava":  # a decoder reading images: one image's 9 placeholders (id 96) among the ids
        pixels = torch.as_tensor(np.random.default_rng(0).standard_normal((1, 3, 30, 30)), dtype=torch.float32)
        ids = dict(input_ids=torch.cat([ids[:, :2], torch.full((1, 9), 96), ids[:, 2:]], 1), pixel_values=pixels)
    if model_type == "qwen2_5_vl":  # one image of 4x4 patches (4 placeholders, id 96) among the ids, at its positions
        image = torch.full((1, 4), 96)
        ids = dict(input_ids=torch.cat([ids[:, :2], image, ids[:, 2:]], 1), image_grid_thw=torch.tensor([[1, 4, 4]]),
                   pixel_values=torch.as_tensor(np.random.default_rng(0).standard_normal((16, 1176)),
                                                dtype=torch.float32),
                   mm_token_type_ids=torch.cat([torch.zeros(1, 2), torch.ones(1, 4), torch.zeros(1, 7)], 1).long())
    if model_type == "gemma3":  # one image pooled to one placeholder (id 96), the only image token
        pixels = torch.as_tensor(np.random.default_rng(0).standard_normal((1, 3, 30, 30)), dtype=torch.float32)
        with_image = torch.cat([ids[:, :2], torch.full((1, 1), 96), ids[:, 2:]], 1)
        ids = dict(input_ids=with_image, pixel_values=pixels, token_type_ids=(with_image == 96).long())
    if CHECKPOINTS[model_type] in AUDIO_SHAPES:  # log-mel frames, and the ids as the decoder's
        frames = np.random.default_rng(0).standard_normal((1, *AUDIO_SHAPES[CHECKPOINTS[model_type]]))
        ids = dict(input_features=torch.as_tensor(frames, dtype=torch.float32), decoder_input_ids=ids)
    if model_type == "mllama_vision_model":  # tiled images with their aspect ratios
        ids = {key: torch.as_tensor(value) for key, value in tiled_images(np.random.default_rng(0)).items()}
    if model_type in ("qwen2_5_vl_vision", "qwen2_vl_vision"):  # an image's patches with its grid
        ids = {key: torch.as_tensor(value) for key, value in merged_images(np.random.default_rng(0)).items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        baseline = config_from_hf(hf)
        encoder_decoder = baseline.family == "encoder_decoder"
        reference, tied = _torch_logits(arch, hf, source, tmp_path, ids, encoder_decoder)
    unchanged = []
    for path, value in _keys(hf):
        if path in ("model_type", "architectures", "transformers_version"):
            continue  # which reader and class: refused or another head, tested elsewhere
        new = _changed(path, value)
        if new is None:
            continue
        changed = _with(hf, path, new)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                derived = config_from_hf(changed)
            except ValueError:
                continue  # refused: not silent
            if derived != baseline:
                continue  # read into the config
            logits = _torch_logits(arch, changed, source, tmp_path, ids, encoder_decoder, tied)
        if logits is REFUSED:
            continue
        if logits is None or not np.allclose(logits[0], reference, atol=1e-6, rtol=0):
            unchanged.append(f"{path}: {value!r} -> {new!r}")
    assert not unchanged, (f"{model_type}: these changes alter transformers' numbers but not jaxformer's config "
                           f"(dropped): {unchanged}")


# transformers' modeling file of each model_type, where a key said to be "never read" must not be read.
MODELING = {"bert": "bert", "roberta": "roberta", "albert": "albert", "electra": "electra", "modernbert": "modernbert",
            "deberta": "deberta", "deberta-v2": "deberta_v2", "gpt2": "gpt2", "llama": "llama", "mistral": "mistral",
            "qwen2": "qwen2", "mixtral": "mixtral", "deepseek_v2": "deepseek_v2", "deepseek_v3": "deepseek_v3",
            "gemma2": "gemma2", "deepseek_v32": "deepseek_v32", "gpt_oss": "gpt_oss", "llama4_text": "llama4",
            "gemma3_text": "gemma3", "gemma4_text": "gemma4", "t5": "t5", "mt5": "mt5", "umt5": "umt5", "mpnet": "mpnet", "bart": "bart", "mbart": "mbart", "m2m_100": "m2m_100", "t5gemma": "t5gemma",
            "marian": "marian", "pegasus": "pegasus", "xlnet": "xlnet", "longformer": "longformer",
            "big_bird": "big_bird", "mistral4": "mistral4"}


def test_keys_said_never_read_are_not_read_by_transformers():
    """The harmless keys whose reason is that transformers never reads them (older files' settings, the
    original releases' ones): its modeling code has no ``config.<key>``."""
    import re
    from pathlib import Path

    for model_type, name in MODELING.items():
        source = (Path(transformers.__file__).parent / "models" / name / f"modeling_{name}.py").read_text()
        read = set(re.findall(r"config\.(\w+)", source))
        said = [key for key, why in BY_MODEL_TYPE[model_type].harmless.items() if "never read" in why]
        assert not set(said) & read, (model_type, set(said) & read)


def test_harmless_keys_are_named_with_a_reason():
    for arch in {id(a): a for a in BY_MODEL_TYPE.values()}.values():
        assert all(isinstance(why, str) and why for why in arch.harmless.values())
    assert all(why for why in HARMLESS.values()) and not set(GENERATION_KEYS) & set(HARMLESS)
