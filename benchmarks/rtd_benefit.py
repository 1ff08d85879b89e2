"""Is ELECTRA's replaced token detection a better use of a CPU's pretraining budget than BERT's masked LM?
Clark et al. (2020) found the discriminator learns more per FLOP than an MLM of the same size; this measures
it at the size of a 2-core CPU, on a held-out probe.

Three starts of one encoder (``--config``: configs/electra_rtd.yaml's discriminator, 4 layers of width 128,
64-wide embeddings, or configs/deberta_v3_rtd.yaml's DeBERTa-v3 discriminator of the same size; bytes as
tokens), each then fine-tuned on named-entity recognition (configs/bert_ner.yaml's data: a third of the
held-out names never occur in training) for the same steps, seed and optimizer:

  rtd       pretrained with ``rtd`` for N steps (its generator, a quarter of the width, trains beside it)
  mlm       pretrained with ``mlm`` (no NSP) on the same data for as many steps as cost the same model FLOPs
            (jaxformer.flops: an rtd step pays for the generator's pass and the discriminator's)
  scratch   no pretraining

It prints each start's pretraining steps and held-out probe metrics (entity F1 by seqeval's rules, word
accuracy) and the rtd run's own held-out detection metrics.

    python benchmarks/rtd_benefit.py [--config configs/electra_rtd.yaml] [--steps 600] [--probe-steps 120]
                                     [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxformer.train import run_config  # noqa: E402
from jaxformer.train.run import train  # noqa: E402

QUIET = ["train.sample_tokens=0", "train.log_every=50"]


def _train(config: str, overrides: list[str]) -> dict:
    cfg = run_config.load(str(ROOT / config), QUIET + overrides)
    return train(cfg, progress=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/electra_rtd.yaml", help="the rtd pretraining config")
    parser.add_argument("--steps", type=int, default=600, help="rtd pretraining steps")
    parser.add_argument("--probe-steps", type=int, default=120, help="NER fine-tuning steps of every start")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from jaxformer.flops import train_flops_per_step

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        common = [f"run.seed={args.seed}", f"checkpoint.every={max(args.steps, 1)}"]
        rtd = _train(args.config, common + [f"run.dir={root / 'rtd'}", f"train.steps={args.steps}",
                                                          f"eval.every={args.steps}"])
        rtd_cfg = rtd["model"].config
        mlm_cfg = rtd_cfg.replace(generator_width=0, head="mlm")
        batch, length = 16, 128
        ratio = train_flops_per_step(rtd_cfg, batch, length) / train_flops_per_step(mlm_cfg, batch, length)
        mlm_steps = round(args.steps * ratio)
        _train(args.config, common + [
            f"run.dir={root / 'mlm'}", "train.objective=mlm", "data.nsp=false", f"train.steps={mlm_steps}",
            f"eval.every={mlm_steps}", f"checkpoint.every={mlm_steps}"])
        model = run_config.load(str(ROOT / args.config)).model  # the scratch start: the same preset and overrides
        shape = [f"model.preset={model.preset}", *(f"model.overrides.{k}={v}" for k, v in model.overrides.items())]
        probe = [f"train.steps={args.probe_steps}", f"eval.every={args.probe_steps}", "checkpoint.every=0",
                 f"run.seed={args.seed}", "data.tokenizer=bytes"]
        starts = {"rtd": [f"model.init_from=jaxformer:{root / 'rtd'}"],
                  "mlm": [f"model.init_from=jaxformer:{root / 'mlm'}"],
                  "scratch": shape}
        results = {}
        for name, start in starts.items():
            out = _train("configs/bert_ner.yaml", probe + start + [f"run.dir={root / ('probe-' + name)}"])
            final = out["history"][-1]
            results[name] = {"pretraining_steps": {"rtd": args.steps, "mlm": mlm_steps, "scratch": 0}[name],
                             "probe_f1": round(final["eval_f1"], 4),
                             "probe_word_accuracy": round(final["eval_accuracy"], 4)}
        detection = {k: round(v, 4) for k, v in rtd["history"][-1].items() if k.startswith("eval_")}
    report = {"flops_ratio_rtd_over_mlm_step": round(ratio, 3), "starts": results, "rtd_held_out": detection}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"an rtd step costs {ratio:.2f} mlm steps of model FLOPs; rtd {args.steps} steps, mlm {mlm_steps} steps")
    print("start     pretraining steps   probe entity F1   probe word accuracy")
    for name, r in results.items():
        print(f"{name:<9} {r['pretraining_steps']:>17}   {r['probe_f1']:>15.3f}   {r['probe_word_accuracy']:>19.3f}")
    print("rtd held-out: " + ", ".join(f"{k}={v}" for k, v in detection.items()))


if __name__ == "__main__":
    main()
