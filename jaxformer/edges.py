"""What the edges (the Hugging Face interop, LoRA) do to a built model, as methods every family inherits.

Model code imports no edge. Each edge hands its function to ``provide`` when it is imported (``import jaxformer``
imports them all), so ``model.save_pretrained(path)`` is a method a reader finds on the class, with its
signature, and runs the edge's code.
"""

from __future__ import annotations

import os
from typing import Any, Callable

_PROVIDED: dict[str, Callable[..., Any]] = {}


def provide(name: str, function: Callable[..., Any]) -> None:
    """``function`` (model, ...) becomes the model method ``name`` of every family."""
    _PROVIDED[name] = function


def _provided(name: str) -> Callable[..., Any]:
    if name not in _PROVIDED:
        raise RuntimeError(f"model.{name} is provided by jaxformer's edge modules, which `import jaxformer` loads")
    return _PROVIDED[name]


class EdgeMethods:
    """The three families' methods whose code lives at the edges."""

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Write config.json + model.safetensors that transformers' from_pretrained loads, and the loaded
        checkpoint's generation_config.json when it had one (``jaxformer.interop.hf.save_pretrained``)."""
        return _provided("save_pretrained")(self, path)

    def save_adapter(self, path: str | os.PathLike) -> None:
        """Write the model's LoRA adapters as a PEFT adapter folder (``jaxformer.interop.peft.save_adapter``)."""
        return _provided("save_adapter")(self, path)

    def merge_adapter(self) -> Any:
        """A plain model whose kernels are W + scaling * A B, as PEFT's merge_and_unload gives
        (``jaxformer.lora.merge_adapter``)."""
        return _provided("merge_adapter")(self)
