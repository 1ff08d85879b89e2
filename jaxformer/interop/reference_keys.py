"""What transformers' own code does with each config.json key, for the model types jaxformer reads: each
config class's field defaults and the names its code reads. The loader consults it for a key that no
architecture file of ours reads: such a key changes nothing when transformers' class never reads it (an
older release's setting: Qwen2.5's ``use_mrope``, SmolLM2's ``is_llama_config``) or when it stands at the
value the class defaults to (what the file would mean without it), and is refused otherwise.

The facts live in ``reference_keys.json`` beside this file, generated from the installed transformers by
``python -m jaxformer.interop.reference_keys`` (loading needs no torch and no transformers). "Reads" is a
static over-approximation, so a doubt refuses: every name the class's configuration and modeling modules (and
the modules they import from other models) load as ``config.<name>``, ``self.<name>`` in a config class,
and every identifier-like string (``getattr(x, "<name>")``, ``kwargs.pop("<name>")``, ``x["<name>"]``, a tuple of
names looped over), and the same in the library-wide modules every model runs through (configuration, rope,
masks, caches, attention, generation).
"""

from __future__ import annotations

import ast
import functools
import json
import math
from pathlib import Path

FACTS = Path(__file__).with_name("reference_keys.json")

# transformers' modules every model's config passes through (paths under the package root).
COMMON_MODULES = ("configuration_utils.py", "modeling_utils.py", "modeling_rope_utils.py", "masking_utils.py",
                  "cache_utils.py", "modeling_layers.py", "modeling_flash_attention_utils.py", "activations.py",
                  "pytorch_utils.py", "utils/generic.py", "generation/utils.py", "generation/configuration_utils.py",
                  "integrations/sdpa_attention.py", "integrations/flash_attention.py",
                  "integrations/flex_attention.py")


@functools.cache
def facts() -> dict:
    return json.loads(FACTS.read_text())


def harmless_reason(model_type: str, key: str, value) -> str | None:
    """Why ``key`` at ``value`` changes nothing transformers computes for ``model_type``, or None when it may
    (or when the type is unknown here: then nothing is assumed)."""
    table = facts()["types"].get(model_type)
    if table is None:
        return None
    if key not in table["reads"] and key not in facts()["common_reads"]:
        return f"transformers' {table['class']} never reads it"
    if key in table["defaults"] and same_value(value, table["defaults"][key]):
        return f"the value {table['class']} defaults to"
    return None


def class_default(model_type: str, key: str):
    """The default of ``key`` in transformers' config class of ``model_type`` (None when unknown)."""
    return facts()["types"].get(model_type, {}).get("defaults", {}).get(key)


def same_value(a, b) -> bool:
    """JSON values equal as transformers would compare them (1 == 1.0, lists == tuples), NaN never equal."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return not (math.isnan(a) or math.isnan(b)) and a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


# --------------------------------------------------------------------------------------------------
# Generating the facts from the installed transformers (a development step; needs transformers)


def names_read(source: str, config_module: bool) -> set[str]:
    """Every name ``source`` may read from a config: attributes loaded off a config-named object (or off
    ``self`` in a configuration module), and every string that could name one (handed to getattr, pop or a
    subscript, directly or through a tuple of names)."""
    read = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            owner = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
            if "config" in owner.lower() or (config_module and owner == "self"):
                read.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            read.add(node.value)  # getattr(config, name) over a tuple of names, kwargs.pop("key"), x["key"], ...
    return read


def _model_sources(package: Path, root: Path) -> list[Path]:
    """The configuration and modeling modules of one model package, and those of other models they import."""
    todo = sorted(p for p in package.glob("*.py") if p.name.startswith(("configuration_", "modeling_")))
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen or not path.exists():
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 2 and node.module and "." in node.module:
                other, module = node.module.split(".", 1)
                if module.startswith(("configuration_", "modeling_")):
                    todo.append(root / "models" / other / f"{module}.py")
    return sorted(seen)


def _json_default(value):
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return None, False
    return value, True


def generate(model_types) -> dict:
    import dataclasses
    import inspect

    import transformers
    from transformers import CONFIG_MAPPING

    root = Path(transformers.__file__).parent
    common = set()
    for module in COMMON_MODULES:
        if (root / module).exists():
            common |= names_read((root / module).read_text(), config_module=module == "configuration_utils.py")
    classes, types = {}, {}
    for model_type in model_types:
        cls = CONFIG_MAPPING[model_type]
        classes[model_type] = cls
        for sub in getattr(cls, "sub_configs", {}).values():  # T5Gemma's halves, Llama 4's text model
            if isinstance(sub, type) and getattr(sub, "model_type", ""):
                classes.setdefault(sub.model_type, sub)
    for model_type, cls in sorted(classes.items()):
        package = Path(inspect.getfile(cls)).parent
        reads = set()
        for path in _model_sources(package, root):
            reads |= names_read(path.read_text(), config_module=path.name.startswith("configuration_"))
        defaults = {}
        for name, parameter in inspect.signature(cls.__init__).parameters.items():
            if name != "self" and parameter.default is not inspect.Parameter.empty:
                value, ok = _json_default(parameter.default)
                if ok:
                    defaults[name] = value
        if dataclasses.is_dataclass(cls):  # a field with a default factory shows no default in the signature
            for field in dataclasses.fields(cls):
                if field.default_factory is not dataclasses.MISSING and field.name not in defaults:
                    value, ok = _json_default(field.default_factory())
                    if ok:
                        defaults[field.name] = value
        types[model_type] = {"class": cls.__name__, "defaults": defaults, "reads": sorted(reads - common)}
    return {"transformers": transformers.__version__, "common_reads": sorted(common), "types": types}


def main(argv: list[str] | None = None) -> None:
    """Regenerate the facts for the model types they hold and any named on the command line (a new
    architecture's)."""
    import sys

    known = set(facts()["types"]) if FACTS.exists() else set()
    FACTS.write_text(json.dumps(generate(sorted(known | set(sys.argv[1:] if argv is None else argv))),
                                indent=1, sort_keys=True) + "\n")
    print(f"wrote {FACTS}")


if __name__ == "__main__":
    main()
