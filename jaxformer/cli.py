"""The ``jaxformer`` command line: ``jaxformer info [NAME] [--json]``."""

from __future__ import annotations

import argparse
import json
import sys

from jaxformer import param_count
from jaxformer.presets import config, presets


def _layers(cfg) -> str:
    if cfg.family == "encoder_decoder":
        return f"{cfg.encoder_layers}+{cfg.decoder_layers}"
    return str(cfg.num_layers)


def info(args: argparse.Namespace) -> int:
    if args.name is None:
        rows = []
        for name in presets():
            cfg = config(name)
            rows.append({"name": name, "family": cfg.family, "layers": _layers(cfg), "d_model": cfg.d_model,
                         "heads": f"{cfg.num_heads}/{cfg.kv_heads}", "params": param_count(cfg)})
        if args.json:
            print(json.dumps(rows, indent=1))
            return 0
        header = f"{'preset':<20} {'family':<16} {'layers':>7} {'d_model':>8} {'heads q/kv':>11} {'params':>17}"
        print(header)
        print("-" * len(header))
        for r in rows:
            print(f"{r['name']:<20} {r['family']:<16} {r['layers']:>7} {r['d_model']:>8} {r['heads']:>11} "
                  f"{r['params']:>17,}")
        return 0
    cfg = config(args.name)
    record = {"name": args.name, "family": cfg.family, "params": param_count(cfg), "config": cfg.to_dict()}
    if args.json:
        print(json.dumps(record, indent=1))
    else:
        print(f"{args.name}: {cfg.family}, {record['params']:,} parameters")
        for key, value in record["config"].items():
            print(f"  {key:<24} {value}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jaxformer", description="The three Transformer families in JAX/Flax.")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("info", help="list presets, or describe one (parameter count from abstract shapes)")
    p.add_argument("name", nargs="?", help="a preset name; omit to list every preset")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=info)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except ValueError as err:
        print(f"jaxformer: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
