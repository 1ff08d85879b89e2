"""Is a decoder-only run worth starting an encoder-decoder from? T5Gemma's claim (Zhang et al. 2025), at
the size of a 2-core CPU.

Numbers to words (configs/t5gemma_numbers.yaml: configs/data/numbers.jsonl, seq2seq, no label smoothing)
is trained for N steps from each start below, with the same data, seed, optimizer and architecture: the
encoder-decoder that ``jf.adapt`` makes of configs/default.yaml's GPT (4 + 4 layers of width 128, learned
positions, tied embeddings, 360 byte-level ids). The script checks that the model configs agree (but for
the decoder's start token: <s> for seq2seq's own starts, <pad> after UL2).

  scratch   that architecture freshly initialised (model.adapt=encoder_decoder on the decoder run's preset
            and overrides, no init_from)
  adapted   model.init_from=jaxformer:DECODER model.adapt=encoder_decoder: every tensor from the decoder
            run (encoder and decoder layers copies of its layers, cross-attention of its self-attention;
            only the 104 vocabulary rows the GPT never saw start fresh)
  +ul2      with --ul2 RUN: an adapted run that went on with UL2 first (configs/t5gemma_adapt.yaml)

It prints each start's held-out loss (token cross-entropy over the whole held-out split, nats) and token
accuracy after N steps, and each loss over the scratch one.

    python train.py                                        # runs/default, the decoder-only GPT (2 minutes)
    python train.py configs/t5gemma_adapt.yaml             # optional: runs/t5gemma_adapt, adapted + UL2
    python benchmarks/adapt_benefit.py [--steps 200] [--decoder runs/default] [--ul2 runs/t5gemma_adapt]
                                       [--lr 1e-3] [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxformer.train import run_config
from jaxformer.train.run import CONFIG_FILE, train

CONFIG = ROOT / "configs" / "t5gemma_numbers.yaml"
GROWN = ["model.adapt=encoder_decoder", "model.overrides.vocab_size=360"]


def starts(decoder: Path, ul2: Path | None) -> dict[str, list[str]]:
    """Each start's config overrides. Scratch rebuilds the decoder run's preset and overrides itself."""
    stored = run_config.load(decoder / CONFIG_FILE, [f"run.dir={decoder}"])
    shape = [f"model.overrides.{key}={value}" for key, value in stored.model.overrides.items()]
    out = {"scratch": ["model.init_from=", f"model.preset={stored.model.preset}", *shape, *GROWN],
           "adapted": [f"model.init_from=jaxformer:{decoder}", *GROWN]}
    if ul2 is not None:
        out["+ul2"] = [f"model.init_from=jaxformer:{ul2}"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--decoder", default="runs/default", help="a decoder-only run folder (python train.py)")
    parser.add_argument("--ul2", default=None, help="an adapted run folder that trained UL2 (optional)")
    parser.add_argument("--lr", type=float, default=None, help="optim.lr for every start (default: the config's)")
    parser.add_argument("--seed", type=int, default=0, help="run.seed: data order and fresh initialisation")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    decoder = ROOT / args.decoder
    if not (decoder / CONFIG_FILE).exists():
        sys.exit(f"{decoder} holds no run: run `python train.py` first (configs/default.yaml, about 2 minutes)")
    common = [f"train.steps={args.steps}", f"eval.every={args.steps}", "checkpoint.every=0", "train.sample_tokens=0",
              f"train.log_every={args.steps}", f"run.seed={args.seed}"] + ([f"optim.lr={args.lr}"] if args.lr else [])
    results, configs = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        for name, overrides in starts(decoder, args.ul2 and ROOT / args.ul2).items():
            with warnings.catch_warnings():  # the scratch start's model.preset note: intended
                warnings.simplefilter("ignore", UserWarning)
                cfg = run_config.load(CONFIG, common + overrides + [f"run.dir={Path(folder) / name}"])
            started = time.perf_counter()
            result = train(cfg, progress=False)
            last = result["history"][-1]
            configs[name] = result["model"].config
            results[name] = {"eval_loss": round(last["eval_loss"], 4), "eval_accuracy": round(last["eval_accuracy"], 4),
                             "seconds": round(time.perf_counter() - started, 1)}
    differ = {name: [k for k, v in cfg.to_dict().items()  # token ids aside (UL2 starts its decoder from <pad>)
                     if v != configs["scratch"].to_dict()[k] and not k.endswith("_token_id")]
              for name, cfg in configs.items()}
    assert not any(differ.values()), f"the starts trained different architectures: {differ}"
    scratch = results["scratch"]["eval_loss"]
    for row in results.values():
        row["loss_over_scratch"] = round(row["eval_loss"] / scratch, 3)
    if args.json:
        print(json.dumps({"steps": args.steps, **results}))
        return
    print(f"numbers to words, {args.steps} steps each, seed {args.seed}, held-out split ({configs['scratch'].name}, "
          f"{configs['scratch'].encoder_layers} + {configs['scratch'].decoder_layers} x {configs['scratch'].d_model})")
    print(f"{'start':9} {'held-out loss':>13} {'accuracy':>9} {'/ scratch':>9} {'seconds':>8}")
    for name, row in results.items():
        print(f"{name:9} {row['eval_loss']:13.4f} {row['eval_accuracy']:9.3f} {row['loss_over_scratch']:9.3f} "
              f"{row['seconds']:8.1f}")


if __name__ == "__main__":
    main()
