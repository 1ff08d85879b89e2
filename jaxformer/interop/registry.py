"""Every Hugging Face architecture jaxformer reads and writes: one file each, one line here.

The loader and the exporter both read this table; adding an architecture is a new file under
``interop`` that defines an ``Architecture``, and its line below.
"""

from __future__ import annotations

from jaxformer.interop import bart, bert, deepseek, gemma, gpt2, llama, t5, t5gemma, xlnet
from jaxformer.interop.rules import Architecture

ARCHITECTURES: tuple[Architecture, ...] = (
    bert.ARCHITECTURE,
    gpt2.ARCHITECTURE,
    deepseek.ARCHITECTURE,
    gemma.ARCHITECTURE,
    llama.ARCHITECTURE,
    t5.ARCHITECTURE,
    t5gemma.ARCHITECTURE,
    bart.ARCHITECTURE,
    xlnet.ARCHITECTURE,
)

BY_MODEL_TYPE: dict[str, Architecture] = {model_type: arch for arch in ARCHITECTURES for model_type in arch.classes}
SUPPORTED: dict[str, tuple[str, ...]] = {model_type: arch.classes[model_type] for model_type, arch in BY_MODEL_TYPE.items()}
