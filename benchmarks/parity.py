"""The parity table of docs/checkpoints-and-interop.md: every tiny checkpoint of tests/hf_factory.py (one or
more per supported model type and head), saved by transformers and loaded by jaxformer, compared layer by
layer with transformers' own model on a padded batch of 2 x 9 tokens (an image model: two drawn images) in
float32. Prints a markdown table of the worst difference of each (max abs over every hidden state, attention map
and the logits) and where it is.

    python benchmarks/parity.py [NAME ...]

Nothing here is timed; the figures are float32 rounding and change only with the code or the libraries.
"""

from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from hf_factory import CHECKPOINTS, save_checkpoint  # noqa: E402
from test_hf_parity import model_inputs  # noqa: E402

from jaxformer.compare import compare  # noqa: E402


def main(names: list[str]) -> None:
    print("| checkpoint | transformers class | worst tensor | max abs |")
    print("|---|---|---|---|")
    for name in names or sorted(CHECKPOINTS):
        with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            save_checkpoint(name, Path(folder))
            rows = compare(folder, **model_inputs(name, np.random.default_rng(0)))
        worst = max(rows, key=lambda r: r.max_abs)
        print(f"| {name} | {CHECKPOINTS[name][1]} | {worst.name} | {worst.max_abs:.1e} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
