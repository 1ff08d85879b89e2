"""PEFT LoRA adapters <-> jaxformer adapters, without torch or peft.

    model = jf.from_pretrained(base_dir, adapter=peft_dir)     # PEFT's adapter_config.json + adapter_model.safetensors
    model.save_adapter(out_dir)                                 # PeftModel.from_pretrained(hf_base, out_dir) loads it

PEFT stores, per adapted torch module ``m`` (a Linear [out, in] or GPT-2's Conv1D [in, out]),
``base_model.model.<m>.lora_A.weight`` [r, in] and ``lora_B.weight`` [out, r], and adds
scaling * B A to the weight (scaling alpha / r, or alpha / sqrt(r) with rsLoRA). jaxformer's adapter of a
kernel [in.., out..] holds A [in.., R] and B [R, out..] (``layers/weights.py``). No table per architecture
maps one to the other: the architecture's own tensor rule for ``<m>.weight`` (``interop/<arch>.py``) is run
on a tensor of indices, which shows for every element of our kernel which input and output index of the
torch weight it came from. A rule that only transposes, reshapes or splits (every projection rule) thereby
gives the input map for A and the output map for B; a rule that does anything else is refused by name.

GPT-2's fused ``c_attn`` splits into our q, k and v: its one A is copied to the three adapters and its B is
split by rows. On export three equal A's (an adapter loaded from PEFT) go back as one; three different ones
(trained here) go out exactly as one adapter of rank 3R whose A stacks the three and whose B is block
diagonal, with PEFT's ``rank_pattern``/``alpha_pattern`` keeping the scaling.

Modules an adapter does not transform (``layers_to_transform``, a narrower ``target_modules``) get zero
factors, which add exactly nothing. Per-module ranks and alphas (``rank_pattern``, ``alpha_pattern``) are
held at the largest rank: factors padded with zeros, B scaled by the module's scaling over the model's.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer import edges
from jaxformer.model_config import LORA_PROJECTIONS, ModelConfig
from jaxformer.interop.files import read_json, write_safetensors
from jaxformer.interop.registry import architecture_of, hf_target, rules_for
from jaxformer.interop.rules import Rule
from jaxformer.layers.weights import LoraParam, refuse_decoding_copy
from jaxformer.lora import under
from jaxformer.models import abstract_model, carry_hf_files

CONFIG, WEIGHTS, PREFIX = "adapter_config.json", "adapter_model.safetensors", "base_model.model."

# LoraConfig fields that change the forward pass or the file, and the only value jaxformer honours.
_DEFAULTS = {"use_dora": False, "bias": "none", "lora_bias": False, "use_qalora": False, "use_bdlora": None,
             "layer_replication": None, "target_parameters": None, "trainable_token_indices": None,
             "alora_invocation_tokens": None, "megatron_config": None, "arrow_config": None, "kasa_config": None,
             "monteclora_config": None, "velora_config": None, "modules_to_tie": None}
# Fields that name or describe the adapter, or matter only when it is first initialised or trained.
_HARMLESS = {"task_type", "peft_type", "auto_mapping", "peft_version", "base_model_name_or_path", "revision",
             "inference_mode", "r", "target_modules", "exclude_modules", "lora_alpha", "lora_dropout",
             "fan_in_fan_out", "use_rslora", "modules_to_save", "init_lora_weights", "layers_to_transform",
             "layers_pattern", "rank_pattern", "alpha_pattern", "megatron_core", "loftq_config", "eva_config",
             "corda_config", "lora_ga_config", "qalora_group_size", "runtime_config", "ensure_weight_tying"}
# init_lora_weights values that leave the base weights as they are (the others rewrite them: PiSSA, OLoRA, ...).
_PLAIN_INITS = (True, False, "gaussian", "eva")


def read_config(path: str | os.PathLike) -> dict:
    """``adapter_config.json`` of a PEFT adapter folder, refusing (one ValueError, before any tensor is read)
    every adapter type and option jaxformer cannot reproduce exactly."""
    folder = Path(path)
    if not (folder / CONFIG).exists():
        raise ValueError(f"{folder} has no {CONFIG}; expected a PEFT adapter folder")
    config = read_json(folder / CONFIG)
    kind = config.get("peft_type")
    if kind != "LORA":
        raise ValueError(f"{folder / CONFIG}: peft_type {kind!r} is not supported; only 'LORA' adapters load")
    problems = [f"{k}={json.dumps(config[k])} (supported: {json.dumps(v)})" for k, v in _DEFAULTS.items()
                if k in config and config[k] != v and not (v is None and config[k] in ({}, []))]
    if config.get("init_lora_weights", True) not in _PLAIN_INITS:
        problems.append(f"init_lora_weights={json.dumps(config['init_lora_weights'])} (it rewrites the base "
                        f"weights; supported: {list(_PLAIN_INITS)})")
    unknown = [k for k, v in config.items() if k not in _HARMLESS and k not in _DEFAULTS and v not in
               (None, False, {}, [], "")]
    problems += [f"{k}={json.dumps(config[k])} (an option jaxformer does not know)" for k in unknown]
    if config.get("target_modules") in (None, "all-linear", ["all-linear"]):
        problems.append(f"target_modules={json.dumps(config.get('target_modules'))} (name the modules or give a regex)")
    for field in ("r", "lora_alpha"):
        if not isinstance(config.get(field, 8), (int, float)) or not config.get(field, 8) > 0:
            problems.append(f"{field}={json.dumps(config.get(field))} (a positive number)")
    if problems:
        raise ValueError(f"{folder / CONFIG}: LoRA options jaxformer does not support: " + "; ".join(problems))
    return config


# --------------------------------------------------------------------------------------------------
# Which torch modules are our projections, and how their indices line up


@dataclass(frozen=True)
class _Piece:
    """One of our kernels fed by a torch weight: which torch input index feeds each of its flattened input
    positions, which torch output index each flattened output position holds."""

    path: tuple[str, ...]
    shape: tuple[int, ...]  # the kernel of one layer: inputs + outputs
    inputs: int
    in_map: np.ndarray
    out_map: np.ndarray


@dataclass(frozen=True)
class _Module:
    """A torch Linear/Conv1D whose weight one rule maps to projection kernels."""

    rule: Rule
    name: str  # the weight's name, with {i} for the layer
    pieces: tuple[_Piece, ...]
    in_features: int
    out_features: int
    conv1d: bool  # stored [in, out] (PEFT's fan_in_fan_out)


def _kernels(cfg: ModelConfig) -> dict[tuple[str, ...], tuple[int, int]]:
    """Every kernel that can carry an adapter: path -> (leading batch axes incl. layers, input axes)."""
    probe = cfg.replace(lora_rank=1, lora_targets=LORA_PROJECTIONS, lora_trainable=(), lora_dropout=0.0, quantize=None)
    state = nnx.state(abstract_model(probe))
    state_flat = {tuple(map(str, p)): v for p, v in nnx.to_flat_state(state)}
    out = {}
    for path, variable in nnx.to_flat_state(state):
        path = tuple(map(str, path))
        if isinstance(variable, LoraParam) and path[-1] == "b":  # b: [batch.., R, out..]; a: [batch.., in.., R]
            batch = variable.get_metadata()["axes"].index("lora_rank")
            a = state_flat[path[:-1] + ("a",)]
            out[path[:-2] + (path[-2].removesuffix("_lora"),)] = (batch, len(a.shape) - 1 - batch)
    return out


def _modules(cfg: ModelConfig, rules: list[Rule]) -> tuple[dict[tuple, _Module], dict[str, str]]:
    """The torch modules whose rule maps them cleanly onto our projection kernels, keyed by (weight name with
    {i}, the rule's layers: one name may cover two stacks, as DeepSeek's dense and MoE layers), and for the
    other weights that rules read, why an adapter on them is not supported."""
    kernels = _kernels(cfg)
    shapes = {tuple(map(str, p)): tuple(v.shape) for p, v in nnx.to_flat_state(nnx.state(abstract_model(cfg)))}
    clean, refused = {}, {}
    for rule in rules:
        weights = [n for n in rule.names if n.endswith(".weight")]
        if not weights:
            continue
        name = weights[0]
        if not all(p in kernels for p in rule.paths):
            refused.update((n, "not a projection jaxformer adapts") for n in weights)
            continue
        if len(rule.names) != 1:
            refused.update((n, ("an expert kernel stacked from many torch weights (PEFT adapts experts "
                                "through target_parameters)")) for n in weights)
            continue
        layered = rule.per_layer
        pieces, fail = [], None
        for path in rule.paths:
            batch, inputs = kernels[path]
            if batch != int(layered):
                fail = "a kernel with an experts axis"
        if fail:
            refused[name] = fail
            continue
        local = [shapes[p][1:] if layered else shapes[p] for p in rule.paths]
        (hf_shape,) = [t.shape for t in rule.save([np.zeros(s, np.int64) for s in local])]
        if len(hf_shape) != 2:
            refused[name] = f"a torch weight of shape {hf_shape}, not a Linear"
            continue
        rows, cols = hf_shape
        parts = rule.load([np.arange(rows * cols, dtype=np.int64).reshape(rows, cols)])
        conv1d = None
        for path, part, shape in zip(rule.paths, parts, local):
            inputs = kernels[path][1]
            if part.dtype != np.int64 or tuple(part.shape) != shape:
                fail = "its tensor rule does more than reorder the weight"
                break
            flat = part.reshape(math.prod(shape[:inputs]), -1)
            r, c = flat // cols, flat % cols
            # Linear [out, in]: the column is the input index; Conv1D [in, out]: the row is.
            for is_conv, i_idx, o_idx in ((False, c, r), (True, r, c)):
                if (i_idx == i_idx[:, :1]).all() and (o_idx == o_idx[:1, :]).all():
                    break
            else:
                fail = "its tensor rule mixes input and output indices"
                break
            if conv1d not in (None, is_conv):
                fail = "its tensor rule is not one layout"
                break
            conv1d = is_conv
            pieces.append(_Piece(path, shape, inputs, i_idx[:, 0].copy(), o_idx[0, :].copy()))
        if fail is None:
            in_features, out_features = (rows, cols) if conv1d else (cols, rows)
            outs = np.concatenate([p.out_map for p in pieces])
            if any(np.sort(p.in_map).tolist() != list(range(in_features)) for p in pieces) or \
                    np.sort(outs).tolist() != list(range(out_features)):
                fail = "its tensor rule does not cover the weight exactly once"
        if fail:
            refused[name] = fail
            continue
        clean[(name, rule.layers)] = _Module(rule, name, tuple(pieces), in_features, out_features, conv1d)
    return clean, refused


def _role(path: tuple[str, ...]) -> str:
    """The ``lora_targets`` sublayer of a kernel path ('attn.q', 'cross_attn.q', 'mlp.wi', ...)."""
    parent = path[-2]
    sub = {"attn": "attn", "cross_attn": "cross_attn", "shared": "shared_experts"}.get(parent, "mlp")
    return f"{sub}.{path[-1]}"


# --------------------------------------------------------------------------------------------------
# PEFT's matching of module names (peft.tuners.tuners_utils.check_target_module_exists)


def _targeted(config: dict, key: str) -> bool:
    exclude = config.get("exclude_modules")
    if exclude:
        if isinstance(exclude, str) and re.fullmatch(exclude, key):
            return False
        if not isinstance(exclude, str) and (key in exclude or any(key.endswith(f".{e}") for e in exclude)):
            return False
    if _saved_module(key, config.get("modules_to_save") or ()):
        return False
    targets = config["target_modules"]
    if isinstance(targets, str):
        return re.fullmatch(targets, key) is not None
    if key in targets:
        return True
    found = any(key.endswith(f".{t}") for t in targets)
    layers = config.get("layers_to_transform")
    if found and layers is not None and layers != []:
        pattern = config.get("layers_pattern")
        match = None
        if not pattern:
            match = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", key)
        else:
            for p in [pattern] if isinstance(pattern, str) else pattern:
                match = re.match(rf"(?:^|.*?\.){p}\.(?P<idx>\d+)\.", key)
                if match is not None:
                    break
        if match is None:
            return False
        index = int(match.group("idx"))
        return index == layers if isinstance(layers, int) else index in layers
    return found


def _pattern(patterns: dict, key: str, default):
    """PEFT's get_pattern_key: the first pattern that matches the end of the module name."""
    for pattern, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", key):
            return value
    return default


# --------------------------------------------------------------------------------------------------
# Loading


def _rules_of(model, names: set[str] | None = None):
    """(model_type, arch, rules, aliases) of a model, as ``from_pretrained`` read it or ``save_pretrained``
    writes it."""
    cfg = model.config
    base = json.loads(getattr(model, "hf_config", None) or "{}")
    model_type, arch = architecture_of(base) if base else hf_target(cfg)
    rules, aliases = rules_for(cfg.replace(lora_rank=0, lora_targets=(), lora_trainable=(), lora_dropout=0.0,
                                           lora_rslora=False, quantize=None), model_type, arch, names)
    return model_type, arch, rules, aliases


def load_adapter(model, path: str | os.PathLike, names: set[str] | None = None, config: dict | None = None):
    """``model`` (a plain float model, as ``from_pretrained`` loads it) with the PEFT LoRA adapter in folder
    ``path``: a new model whose config carries the adapter (rank, alpha, targets, rsLoRA, dropout, and
    ``modules_to_save`` as ``lora_trainable``). Every tensor is checked first; one ValueError lists the
    missing, unexpected and mis-shaped ones, and nothing is built."""
    folder = Path(path)
    config = config if config is not None else read_config(folder)
    cfg: ModelConfig = model.config
    if cfg.lora is not None or cfg.quantization is not None:
        raise ValueError(f"{cfg.name!r} already has adapters or int8 kernels; load the adapter onto the float base")
    if not (folder / WEIGHTS).exists():
        raise ValueError(f"{folder} has no {WEIGHTS} (pickled adapter_model.bin files are not read)")
    import safetensors

    try:  # through JAX, which (unlike numpy) holds bfloat16
        with safetensors.safe_open(str(folder / WEIGHTS), framework="flax") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as err:  # SafetensorError has no stable import path
        raise ValueError(f"{folder / WEIGHTS} is not a readable safetensors file: {err}") from None
    _, arch, rules, _ = _rules_of(model, names)
    modules, refused = _modules(cfg, rules)
    r, alpha, rslora = config.get("r", 8), config.get("lora_alpha", 8), bool(config.get("use_rslora", False))

    def scaling(rank, a):
        return a / (math.sqrt(rank) if rslora else rank)

    # What PEFT would adapt, and the tensors that says the file holds.
    expected, problems, adapted = {}, [], {}
    for rule in rules:
        for weight, i in [(n, i) for n in rule.names if n.endswith(".weight") for i in rule.layer_range(cfg)]:
            key = weight.format(i=i).removesuffix(".weight")
            if not _targeted(config, key):
                continue
            if (weight, rule.layers) not in modules:
                problems.append(f"{key}: {refused.get(weight, 'not a projection jaxformer adapts')}")
                continue
            m = modules[(weight, rule.layers)]
            rank = int(_pattern(config.get("rank_pattern"), key, r))
            a = _pattern(config.get("alpha_pattern"), key, alpha)
            adapted[key] = (m, i, rank, scaling(rank, a))
            expected[f"{PREFIX}{key}.lora_A.weight"] = (rank, m.in_features)
            expected[f"{PREFIX}{key}.lora_B.weight"] = (m.out_features, rank)
    if problems:
        raise ValueError(f"{folder / CONFIG}: target_modules match modules jaxformer cannot adapt: {problems[:20]}")
    saved = _saved_modules(cfg, rules, config.get("modules_to_save") or ())
    expected.update((PREFIX + name, None) for name in saved)  # shapes checked against the base below
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    misshaped = [f"{k}: {tuple(tensors[k].shape)}, expected {expected[k]}" for k in sorted(expected)
                 if k in tensors and expected[k] is not None and tuple(tensors[k].shape) != expected[k]]
    non_float = [f"{k} ({tensors[k].dtype})" for k in sorted(tensors) if not jnp.issubdtype(tensors[k].dtype, jnp.floating)]
    if missing or unexpected or misshaped or non_float or not adapted:
        parts = [f"{label} ({len(items)}): {items[:20]}" for label, items in
                 (("missing tensors", missing), ("unexpected tensors", unexpected), ("mis-shaped tensors", misshaped),
                  ("non-float tensors", non_float)) if items]
        if not adapted:
            parts.append(f"target_modules {config['target_modules']!r} match no module of {arch}")
        raise ValueError(f"{folder} does not match {arch}; nothing was loaded.\n  " + "\n  ".join(parts))

    # Our adapters: one rank R (the largest), one scaling; other modules padded and their B rescaled.
    R = max(rank for _, _, rank, _ in adapted.values())
    s = scaling(r, alpha)
    model_alpha = s * (math.sqrt(R) if rslora else R)
    base = {tuple(map(str, p)): v[...] for p, v in nnx.to_flat_state(nnx.state(model))}
    factors: dict[tuple[str, ...], list[np.ndarray]] = {}  # kernel path -> [A, B], stacked over layers
    for key, (m, i, rank, s_m) in adapted.items():
        a_hf = np.asarray(tensors[f"{PREFIX}{key}.lora_A.weight"], np.float32)
        b_hf = np.asarray(tensors[f"{PREFIX}{key}.lora_B.weight"], np.float32)
        ratio = s_m / s
        if abs(ratio - 1.0) > 1e-12:
            b_hf = b_hf * np.float32(ratio)
        a_hf = np.pad(a_hf, ((0, R - rank), (0, 0)))
        b_hf = np.pad(b_hf, ((0, 0), (0, R - rank)))
        index = list(m.rule.layer_range(cfg)).index(i)
        for piece in m.pieces:
            ins, outs = piece.shape[:piece.inputs], piece.shape[piece.inputs:]
            a = a_hf.T[piece.in_map].reshape(*ins, R)
            b = b_hf[piece.out_map].T.reshape(R, *outs)
            if piece.path not in factors:
                layers = len(m.rule.layer_range(cfg)) if m.rule.per_layer else None
                lead = (layers,) if layers is not None else ()
                factors[piece.path] = [np.zeros((*lead, *a.shape), np.float32), np.zeros((*lead, *b.shape), np.float32)]
            slot = index if m.rule.per_layer else ...
            factors[piece.path][0][slot] = a
            factors[piece.path][1][slot] = b
    # modules_to_save: their tensors replace the base's, and they train in full.
    trainable, replaced = [], {}
    for rule in rules:
        held = [n.format(i=i) in saved for n in rule.names for i in rule.layer_range(cfg)]
        if any(held) and (rule.per_layer or not all(held)):
            raise ValueError(f"{folder / CONFIG}: modules_to_save {config['modules_to_save']} cover {rule.names[0]}, "
                             "a module inside the layer stack or part of a fused tensor, which is not supported")
        if any(held):
            parts = rule.load([np.asarray(tensors[PREFIX + n], np.float32) for n in rule.names])
            for p, part in zip(rule.paths, parts):
                if tuple(part.shape) != tuple(base[p].shape):
                    raise ValueError(f"{folder / WEIGHTS}: {rule.names} give {'/'.join(p)} the shape "
                                     f"{tuple(part.shape)}, the base has {tuple(base[p].shape)}; nothing was loaded")
                replaced[p] = part
                trainable.append("/".join(p))

    # Every variable of the adapted model is known (base, factors, zeros), so it is assembled, not initialised.
    adapted_cfg = cfg.replace(lora_rank=R, lora_alpha=model_alpha, lora_targets=tuple(sorted({_role(p) for p in factors})),
                              lora_dropout=float(config.get("lora_dropout", 0.0)), lora_rslora=rslora,
                              lora_trainable=tuple(trainable))
    graphdef, abstract = nnx.split(abstract_model(adapted_cfg))
    flat = []
    for where, variable in nnx.to_flat_state(abstract):
        key = tuple(map(str, where))
        kernel = key[:-2] + (key[-2].removesuffix("_lora"),)
        if isinstance(variable, LoraParam):
            value = factors[kernel][0 if key[-1] == "a" else 1] if kernel in factors else np.zeros(variable.shape)
        else:
            value = replaced.get(key, base[key])
        flat.append((where, variable.replace(jnp.asarray(value, variable.dtype))))
    have = {tuple(map(str, p)) for p, v in flat if isinstance(v, LoraParam)}
    missing = sorted("/".join(k) for k in factors if k[:-1] + (k[-1] + "_lora", "a") not in have)
    if missing:  # a sublayer _role misreads; never expected
        raise ValueError(f"adapter targets {adapted_cfg.lora.targets} leave {missing} without an adapter")
    return carry_hf_files(model, nnx.merge(graphdef, nnx.from_flat_state(flat)))


def _saved_module(module: str, modules_to_save) -> bool:
    """Does ``modules_to_save`` cover the module ``module`` (a dotted path)? As PEFT matches them: a module whose
    name ends with an entry (so 'classifier' takes DistilBERT's 'pre_classifier' too), or one inside it."""
    parts = module.split(".")
    return any(".".join(parts[:k]).endswith(m) for m in modules_to_save for k in range(1, len(parts) + 1))


def _saved_modules(cfg: ModelConfig, rules: list[Rule], modules_to_save) -> dict[str, str]:
    """HF tensor names (outside the layer stack) that ``modules_to_save`` covers -> their module."""
    out = {}
    for rule in rules:
        for i in rule.layer_range(cfg):
            for n in rule.names:
                name = n.format(i=i)
                if _saved_module(name.rsplit(".", 1)[0], modules_to_save):
                    out[name] = name.rsplit(".", 1)[0]
    return out


# --------------------------------------------------------------------------------------------------
# Saving


def adapter_tensors(model) -> tuple[dict[str, np.ndarray], dict]:
    """The model's adapters (and ``lora_trainable`` modules) as PEFT's tensors and adapter_config.json."""
    refuse_decoding_copy(model, "save the adapters of")
    cfg: ModelConfig = model.config
    if cfg.lora is None:
        raise ValueError(f"{cfg.name!r} has no LoRA adapters to save")
    _, arch, rules, _ = _rules_of(model)
    plain = cfg.replace(lora_rank=0, lora_targets=(), lora_trainable=(), lora_dropout=0.0, lora_rslora=False,
                        quantize=None)  # an int8 base (QLoRA) saves the same float adapter
    modules, refused = _modules(plain, rules)
    flat = {tuple(map(str, p)): np.asarray(v[...], np.float32) for p, v in nnx.to_flat_state(nnx.state(model))}
    adapters = {p[:-2] + (p[-2].removesuffix("_lora"),) for p in flat if p[-1] in ("a", "b") and p[-2].endswith("_lora")}
    R, alpha = cfg.lora.rank, cfg.lora.alpha
    tensors, rank_pattern, alpha_pattern, exported = {}, {}, {}, set()
    covered = set()
    for m in modules.values():
        paths = [p.path for p in m.pieces]
        if not any(p in adapters for p in paths):
            continue
        covered.update(paths)
        layers = list(m.rule.layer_range(cfg))
        # The kernels of this weight that carry an adapter; of those, the ones whose B is not zero (a piece
        # whose B is zero adds nothing, so it needs no block of its own).
        lora = [(piece, flat[piece.path[:-1] + (piece.path[-1] + "_lora", "a")],
                 flat[piece.path[:-1] + (piece.path[-1] + "_lora", "b")]) for piece in m.pieces if piece.path in adapters]
        per_piece = [x for x in lora if x[2].any()] or lora
        k = len(per_piece)
        shared = k == 1 or all(np.array_equal(per_piece[0][1], a) for _, a, _ in per_piece[1:])
        rank = R if shared else k * R
        for index, i in enumerate(layers):
            key = m.name.format(i=i).removesuffix(".weight")
            a_hf = np.zeros((rank, m.in_features), np.float32)
            b_hf = np.zeros((m.out_features, rank), np.float32)
            for j, (piece, a, b) in enumerate(per_piece):
                a_l, b_l = (a[index], b[index]) if m.rule.per_layer else (a, b)
                cols = slice(0, R) if shared else slice(j * R, (j + 1) * R)
                a_hf[cols][:, piece.in_map] = a_l.reshape(-1, R).T
                b_hf[piece.out_map, cols] = b_l.reshape(R, -1).T
            tensors[f"{PREFIX}{key}.lora_A.weight"] = a_hf
            tensors[f"{PREFIX}{key}.lora_B.weight"] = b_hf
            exported.add(key)
        if not shared:
            leaf = m.name.rsplit(".", 2)[-2]
            rank_pattern[leaf] = rank
            alpha_pattern[leaf] = alpha * (math.sqrt(k) if cfg.lora.rslora else k)
    for path in sorted(adapters - covered):
        a = flat[path[:-1] + (path[-1] + "_lora", "a")]
        b = flat[path[:-1] + (path[-1] + "_lora", "b")]
        if a.any() and b.any():
            raise ValueError(f"the adapter on {'/'.join(path)} has no PEFT form: its torch weight is "
                             f"{_why(path, rules, refused)}")
    if not exported:
        raise ValueError(f"{cfg.name!r}: none of its adapters maps to a torch module of {arch}")
    # modules_to_save: the torch tensors of every rule whose parameters lora_trainable lists.
    saved_modules = set()
    for rule in rules:
        listed = [under("/".join(p), cfg.lora.trainable) for p in rule.paths]
        if not any(listed):
            continue
        if not all(listed) or rule.per_layer:
            raise ValueError(f"lora_trainable {cfg.lora.trainable} covers part of {rule.names} or a layer of the "
                             "stack; PEFT's modules_to_save holds whole modules outside the layers")
        for name, t in zip(rule.names, rule.save([flat[p] for p in rule.paths])):
            tensors[PREFIX + name] = np.ascontiguousarray(t)
            saved_modules.add(name.rsplit(".", 1)[0])
    config = {"peft_type": "LORA", "task_type": None, "base_model_name_or_path": _base_name(model), "r": R,
              "lora_alpha": alpha, "target_modules": _target_modules(exported, rules, cfg),
              "use_rslora": cfg.lora.rslora, "lora_dropout": cfg.lora.dropout,
              "fan_in_fan_out": any(m.conv1d for m in modules.values() if any(p.path in covered for p in m.pieces)),
              "bias": "none", "use_dora": False, "init_lora_weights": True, "inference_mode": True,
              "modules_to_save": sorted(saved_modules) or None, "rank_pattern": rank_pattern,
              "alpha_pattern": alpha_pattern, "layers_to_transform": None, "layers_pattern": None}
    return tensors, config


def _why(path, rules, refused) -> str:
    for rule in rules:
        if path in rule.paths:
            return f"{rule.names[0]}, {refused.get(rule.names[0], 'not adaptable')}"
    return "not one a rule maps"


def _base_name(model) -> str | None:
    hf = json.loads(getattr(model, "hf_config", None) or "{}")
    return hf.get("_name_or_path") or None


def _target_modules(exported: set[str], rules: list[Rule], cfg: ModelConfig) -> list[str]:
    """The leaf names of the adapted modules where, matched as PEFT matches them (by suffix), they pick out
    exactly those modules; else every module by its full name."""
    every = {n.format(i=i).removesuffix(".weight") for rule in rules for n in rule.names if n.endswith(".weight")
             for i in rule.layer_range(cfg)}
    leaves = sorted({k.rsplit(".", 1)[-1] for k in exported})
    matched = {k for k in every if any(k == t or k.endswith(f".{t}") for t in leaves)}
    return leaves if matched == exported else sorted(exported)


def save_adapter(model, path: str | os.PathLike) -> None:
    """Write the model's adapters as a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors)
    that ``PeftModel.from_pretrained(hf_base_model, path)`` loads."""
    tensors, config = adapter_tensors(model)
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(tensors, folder / WEIGHTS)
    tmp = folder / (CONFIG + ".tmp")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, folder / CONFIG)


edges.provide("save_adapter", save_adapter)
