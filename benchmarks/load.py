"""Checkpoint load time: jaxformer.from_pretrained vs transformers' from_pretrained, same folder.

A gpt2-sized (124M) checkpoint with random weights is written once to a temp folder in the real
Hugging Face format; both libraries then load it alternately, ``--repeats`` times each, and the
medians are compared. Both include reading safetensors, building the model and placing weights in
memory (jaxformer: on the default JAX device, waited for with block_until_ready).

    python benchmarks/load.py [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import jax
    import torch
    import transformers

    import jaxformer as jf

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    folder = Path(tempfile.mkdtemp(prefix="jaxformer-load-"))
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config()).save_pretrained(str(folder))

    def load_jaxformer():
        model = jf.from_pretrained(folder)
        jax.block_until_ready(jax.tree.leaves(jf.split(model)[1]))

    def load_transformers():
        transformers.GPT2LMHeadModel.from_pretrained(str(folder))

    load_jaxformer(), load_transformers()  # warm caches and imports on both sides
    times = {"jaxformer": [], "transformers": []}
    for _ in range(args.repeats):
        for name, fn in (("jaxformer", load_jaxformer), ("transformers", load_transformers)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    jf_s, hf_s = statistics.median(times["jaxformer"]), statistics.median(times["transformers"])
    result = {"params": jf.param_count(jf.from_pretrained(folder).config), "jaxformer_s": round(jf_s, 4),
              "transformers_s": round(hf_s, 4), "speedup": round(hf_s / jf_s, 3)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"gpt2 (124M) checkpoint load, median of {args.repeats}")
        print(f"  jaxformer.from_pretrained     {jf_s:8.3f} s")
        print(f"  transformers.from_pretrained  {hf_s:8.3f} s")
        print(f"  speedup (transformers / jaxformer): {hf_s / jf_s:.2f}x  (target >= 1.0x)")


if __name__ == "__main__":
    main()
