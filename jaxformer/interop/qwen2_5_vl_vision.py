"""Qwen2.5-VL's and Qwen2-VL's vision towers (``qwen2_5_vl_vision``: Qwen2_5_VisionTransformerPretrainedModel;
``qwen2_vl_vision``: Qwen2VisionTransformerPretrainedModel): an encoder of ours whose front end reads images of any
size already cut into patches (``ModelConfig.patches`` with ``patch_merge_size``), read and written both ways,
alone and inside a joined file.

How the joined model (``qwen2_5_vl``) uses the tower:

    fields = qwen2_5_vl_vision_from_hf(with_defaults(sub_config(hf, "vision_config"), QWEN2_5_VL_VISION_DEFAULTS))
    tower = ModelConfig.from_dict(fields)
    qwen2_5_vl_vision_to_hf(tower, out["vision_config"])                       # every setting written back
    rules = qwen2_5_vl_vision_rules(tower, "model.visual.", at=("vision",))   # its tensors, under those names
    features = tower_module(pixel_values=pv, image_grid_thw=thw).pooler_output  # [patches / merge², out width]

The tower: the patches of ``temporal_patch_size`` frames [P, C * T * p * p] projected by the Conv3d without bias
(its weight reshaped: the file round-trips byte for byte), 2-D rotary positions over each patch's row and column
(``rope_axial``), pre-norm blocks (RMSNorm, fused qkv with biases, SwiGLU with biases: Qwen2.5-VL; LayerNorm and a
GELU MLP: Qwen2-VL), and the merger (ln_q, Linear, GELU, Linear over each merge x merge block) giving
pooler_output in the processor's order. Qwen2.5-VL's blocks attend within windows of ``window_size`` pixels
(layer_types 'window') but those of ``fullatt_block_indexes`` ('full'); the patches run window by window, as
transformers orders them, so last_hidden_state and hidden_states (the embedded patches, then each block's output)
come in that order, as transformers returns them. No block attends across images or frames.

``fullatt_block_indexes`` past the tower's depth are ignored by transformers and not written back.
``tokens_per_second`` belongs to the text model's M-RoPE (the joined model reads it; the tower never does).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxformer.interop.rules import (INVERSE_ACTIVATIONS, INVERSE_GATED, Architecture, Rule, activation, copy, dense,
                                     fused_heads_in, heads_out, linear, norm, refuse, rope_params)
from jaxformer.model_config import ModelConfig

# the config classes' defaults (Qwen2_5_VLVisionConfig, Qwen2VLVisionConfig)
QWEN2_5_VL_VISION_DEFAULTS = dict(depth=32, hidden_size=3584, hidden_act="silu", intermediate_size=3420, num_heads=16,
                                  in_channels=3, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                                  window_size=112, out_hidden_size=3584, fullatt_block_indexes=(7, 15, 23, 31))
QWEN2_VL_VISION_DEFAULTS = dict(depth=32, embed_dim=1280, hidden_size=3584, hidden_act="quick_gelu", mlp_ratio=4,
                                num_heads=16, in_channels=3, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
NORM_EPS = 1e-6  # every norm of both towers (transformers fixes it; no key sets it)
# keys of a vision_config that change no number of the tower, with the reason
VISION_HARMLESS = {"tokens_per_second": "the text model's M-RoPE reads it (video positions), never the tower",
                   "in_chans": "an older spelling transformers' tower never reads (it reads in_channels)",
                   "spatial_patch_size": "an older spelling transformers' tower never reads (it reads patch_size)"}


def _rope_theta(hf: dict, model_type: str) -> float:
    """The axial rotary base as transformers reads it: ``rope_scaling`` or ``rope_parameters``' rope_theta, else the
    file's ``rope_theta``, else 10000."""
    params = rope_params(hf, 10000.0)
    kind = params.get("rope_type", params.get("type", "axial"))
    unknown = sorted(set(params) - {"rope_type", "type", "rope_theta"})
    refuse(kind not in ("axial", "default") or unknown, f"{model_type}: rope_parameters={params!r}; the tower's "
           "rotary is axial, set by rope_theta alone")
    theta = params["rope_theta"]
    refuse(isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0,
           f"{model_type}: rope_theta={theta!r} must be a number > 0")
    return float(theta)


def _shared_from_hf(hf: dict, model_type: str, width: int) -> dict[str, Any]:
    """What both towers spell alike (``width``: the tower's own, hidden_size or embed_dim). num_attention_heads and
    num_hidden_layers are the config classes' other names (attribute_map) of num_heads and depth."""
    heads, depth = hf.get("num_attention_heads", hf["num_heads"]), hf.get("num_hidden_layers", hf["depth"])
    refuse(width % heads, f"{model_type}: num_heads={heads} does not divide the width {width}")
    head_dim = hf.get("head_dim")  # (read by transformers' rotary alone: a width of its own would turn other angles)
    refuse(head_dim is not None and head_dim != width // heads,
           f"{model_type}: head_dim={head_dim!r} differs from the attention's {width // heads}")
    patch = hf["patch_size"]
    refuse(isinstance(patch, (list, tuple)), f"{model_type}: patch_size={patch!r}: one int (square patches)")
    temporal = hf["temporal_patch_size"]
    refuse(isinstance(temporal, (list, tuple)), f"{model_type}: temporal_patch_size={temporal!r}: one int")
    return dict(family="encoder", vocab_size=0, d_model=width, num_heads=heads, encoder_layers=depth,
                decoder_layers=0, norm_position="pre", norm_eps=NORM_EPS, position="rope",
                rope_theta=_rope_theta(hf, model_type), rope_axial=True, head="none", final_norm=False,
                qkv_bias=True, key_bias=True, out_bias=True, mlp_bias=True, image_size=0, patch_size=patch,
                image_channels=hf["in_channels"], class_token=False, patch_bias=False, temporal_patch_size=temporal,
                patch_merge_size=hf["spatial_merge_size"])


def qwen2_5_vl_vision_from_hf(hf: dict, model_type: str = "qwen2_5_vl_vision") -> dict[str, Any]:
    """ModelConfig fields of a Qwen2_5_VLVisionConfig (a file's ``vision_config`` over
    ``QWEN2_5_VL_VISION_DEFAULTS``): RMSNorm, SwiGLU with biases, windows but at ``fullatt_block_indexes``."""
    fields = _shared_from_hf(hf, model_type, hf["hidden_size"])
    depth, full = fields["encoder_layers"], hf["fullatt_block_indexes"]
    refuse(not isinstance(full, (list, tuple)) or any(isinstance(i, bool) or not isinstance(i, int) for i in full),
           f"{model_type}: fullatt_block_indexes={full!r} must be a list of ints")
    window, unit = hf["window_size"], hf["spatial_merge_size"] * hf["patch_size"]
    kinds = tuple("full" if i in full else "window" for i in range(depth))
    windowed = "window" in kinds
    refuse(windowed and (isinstance(window, bool) or not isinstance(window, int) or window < unit),
           f"{model_type}: window_size={window!r} must be an int of at least spatial_merge_size * patch_size={unit} "
           "pixels (a window holds whole merged blocks)")
    # (Qwen2_5_VLMLP gates with any ACT2FN name: the exact gelu too, which the gated table of text models lacks)
    act = "geglu_erf" if hf["hidden_act"] == "gelu" else activation(hf["hidden_act"], True, model_type)
    fields.update(activation=act, norm="rmsnorm",
                  d_ff=hf["intermediate_size"], merged_width=hf["out_hidden_size"], image_window=window,
                  attention="alternating" if windowed else "bidirectional", layer_types=kinds if windowed else None)
    return fields


def qwen2_5_vl_vision_to_hf(cfg: ModelConfig, out: dict) -> None:
    """A Qwen2_5_VLVisionConfig of the tower ``cfg`` into ``out``, every setting written."""
    refuse(cfg.activation not in INVERSE_GATED or cfg.norms.kind != "rmsnorm",
           f"qwen2_5_vl_vision is RMSNorm with a gated MLP, not norm={cfg.norms.kind!r}, activation={cfg.activation!r}")
    kinds = cfg.layer_types or ("full",) * cfg.encoder_layers
    _shared_to_hf(cfg, out)
    out.update(hidden_size=cfg.d_model, hidden_act=INVERSE_GATED[cfg.activation],
               intermediate_size=cfg.d_ff, window_size=cfg.patches.window, out_hidden_size=cfg.patches.merged_width,
               fullatt_block_indexes=[i for i, kind in enumerate(kinds) if kind == "full"])


def qwen2_vl_vision_from_hf(hf: dict, model_type: str = "qwen2_vl_vision") -> dict[str, Any]:
    """ModelConfig fields of a Qwen2VLVisionConfig (over ``QWEN2_VL_VISION_DEFAULTS``): LayerNorm, a GELU MLP of
    ``mlp_ratio`` times ``embed_dim``, no windows; the merger ends at ``hidden_size`` (the text model's width)."""
    width = hf["embed_dim"]
    fields = _shared_from_hf(hf, model_type, width)
    ratio = hf["mlp_ratio"]
    refuse(isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or int(width * ratio) != width * ratio,
           f"{model_type}: mlp_ratio={ratio!r} must give a whole MLP width (embed_dim * mlp_ratio)")
    fields.update(activation=activation(hf["hidden_act"], False, model_type), norm="layernorm", norm_bias=True,
                  d_ff=int(width * ratio), merged_width=hf["hidden_size"], attention="bidirectional")
    return fields


def qwen2_vl_vision_to_hf(cfg: ModelConfig, out: dict) -> None:
    """A Qwen2VLVisionConfig of the tower ``cfg`` into ``out``, every setting written."""
    refuse(cfg.activation not in INVERSE_ACTIVATIONS or cfg.norms.kind != "layernorm" or cfg.layer_types
           or cfg.d_ff % cfg.d_model, f"qwen2_vl_vision is LayerNorm, an ungated MLP of a whole multiple of the width "
           f"and no windows, not norm={cfg.norms.kind!r}, activation={cfg.activation!r}, d_ff={cfg.d_ff}")
    _shared_to_hf(cfg, out)
    out.update(embed_dim=cfg.d_model, hidden_size=cfg.patches.merged_width,
               hidden_act=INVERSE_ACTIVATIONS[cfg.activation], mlp_ratio=cfg.d_ff // cfg.d_model)


def _shared_to_hf(cfg: ModelConfig, out: dict) -> None:
    patches = cfg.patches
    refuse(patches is None or not patches.merge or cfg.head != "none",
           f"{cfg.name!r} is no Qwen2-VL image tower (patch_merge_size 0 or a head)")
    out.pop("vocab_size", None)  # (an image tower has no vocabulary; its config class no such key)
    out.update(depth=cfg.encoder_layers, num_heads=cfg.num_heads, in_channels=patches.channels,
               patch_size=patches.patch_size, spatial_merge_size=patches.merge, temporal_patch_size=patches.temporal,
               rope_parameters={"rope_theta": cfg.rotary.theta, "rope_type": "axial"})


def qwen2_5_vl_vision_rules(cfg: ModelConfig, prefix: str, at: tuple[str, ...] = ()) -> list[Rule]:
    """The tower's tensors under ``prefix`` ('visual.' in published Qwen2.5-VL and Qwen2-VL files,
    'model.visual.' as transformers 5 writes them, '' alone), read into the Encoder at ``at``; either tower's, as
    ``cfg`` says (a gated MLP: Qwen2.5-VL's names)."""
    p, patches = prefix, cfg.patches
    shape = (cfg.d_model, patches.channels, patches.temporal, patches.patch_size, patches.patch_size)
    bias = cfg.norms.kind == "layernorm"
    return [Rule((at + ("patches", "projection", "kernel"),), (f"{p}patch_embed.proj.weight",),
                 lambda t: [t[0].reshape(t[0].shape[0], -1).T], lambda k: [k[0].T.reshape(shape)]),
            *norm(at + ("merger", "norm"), f"{p}merger.ln_q", bias),
            *dense(at + ("merger", "fc1"), f"{p}merger.mlp.0"), *dense(at + ("merger", "fc2"), f"{p}merger.mlp.2"),
            *_block_rules(cfg, p, at)]


def _block_rules(cfg: ModelConfig, prefix: str, at: tuple[str, ...]) -> list[Rule]:
    layer, stack = f"{prefix}blocks.{{i}}", at + ("encoder", "blocks")
    N, H = cfg.num_heads, cfg.head_dim_
    attn, mlp = stack + ("attn",), stack + ("mlp",)
    split = lambda t: [b.reshape(N, H) for b in np.split(t[0], 3)]  # noqa: E731  (q, k, v biases stacked)
    rules = [fused_heads_in([attn + (n,) for n in "qkv"], f"{layer}.attn.qkv.weight", (N, N, N), H),
             Rule(tuple(attn + (f"{n}_bias",) for n in "qkv"), (f"{layer}.attn.qkv.bias",), split,
                  lambda ps: [np.concatenate([b.reshape(-1) for b in ps])]),
             heads_out(attn + ("o",), f"{layer}.attn.proj.weight", N, H),
             copy(attn + ("o_bias",), f"{layer}.attn.proj.bias"),
             *norm(stack + ("attn_norm",), f"{layer}.norm1", cfg.norms.kind == "layernorm"),
             *norm(stack + ("mlp_norm",), f"{layer}.norm2", cfg.norms.kind == "layernorm")]
    if cfg.gated:
        m = f"{layer}.mlp."
        rules += [linear(mlp + ("wi_gate",), f"{m}gate_proj.weight"), copy(mlp + ("bi_gate",), f"{m}gate_proj.bias"),
                  linear(mlp + ("wi",), f"{m}up_proj.weight"), copy(mlp + ("bi",), f"{m}up_proj.bias"),
                  linear(mlp + ("wo",), f"{m}down_proj.weight"), copy(mlp + ("bo",), f"{m}down_proj.bias")]
    else:
        rules += [linear(mlp + ("wi",), f"{layer}.mlp.fc1.weight"), copy(mlp + ("bi",), f"{layer}.mlp.fc1.bias"),
                  linear(mlp + ("wo",), f"{layer}.mlp.fc2.weight"), copy(mlp + ("bo",), f"{layer}.mlp.fc2.bias")]
    return [rule.in_layers(0, cfg.encoder_layers) for rule in rules]


_READERS = {"qwen2_5_vl_vision": (qwen2_5_vl_vision_from_hf, qwen2_5_vl_vision_to_hf),
            "qwen2_vl_vision": (qwen2_vl_vision_from_hf, qwen2_vl_vision_to_hf)}


def _config_from_hf(hf: dict, model_type: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
    return _READERS[model_type][0](hf, model_type)


def _config_to_hf(cfg: ModelConfig, model_type: str, out: dict) -> None:
    _READERS[model_type][1](cfg, out)


def _rules(cfg: ModelConfig, model_type: str, arch: str, prefix: str) -> tuple[list[Rule], dict[str, str]]:
    return qwen2_5_vl_vision_rules(cfg, prefix), {}


# The towers alone, as transformers saves them (the tensors bare)
ARCHITECTURE = Architecture(
    {"qwen2_5_vl_vision": ("Qwen2_5_VisionTransformerPretrainedModel",),
     "qwen2_vl_vision": ("Qwen2VisionTransformerPretrainedModel",)},
    {"qwen2_5_vl_vision": "", "qwen2_vl_vision": ""},
    ("Qwen2_5_VisionTransformerPretrainedModel", "Qwen2VisionTransformerPretrainedModel"),
    _config_from_hf, _config_to_hf, _rules, harmless=VISION_HARMLESS,
    defaults={"qwen2_5_vl_vision": QWEN2_5_VL_VISION_DEFAULTS, "qwen2_vl_vision": QWEN2_VL_VISION_DEFAULTS})
