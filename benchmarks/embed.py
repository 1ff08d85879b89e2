"""Sentence-embedding throughput: jf.Embedder.encode vs SentenceTransformer.encode, same folder, float32.

An all-MiniLM-L6-v2-shaped folder (BERT, 6 layers, width 384, 12 heads, FFN 1536, mean pooling, Normalize,
max_seq_length 128) with random weights and a word-level WordPiece vocabulary is written once to a temp
folder by sentence-transformers itself. A corpus of ``--sentences`` sentences of 4-60 words is then
encoded by both libraries in turn, ``--repeats`` times each, alternating (A, B, A, B, ...) so machine load
hits both; after one untimed warm-up each (jaxformer compiles its power-of-two shapes there). Reports
sentences/s from the median times, their ratio and the largest difference between the two matrices.

    python benchmarks/embed.py [--sentences 2000] [--repeats 5] [--batch-size 32] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
import warnings
from pathlib import Path

WORDS = ("the a man woman child dog cat eats rides plays reads writes food horse guitar book letter road sky "
         "river city market morning evening quickly slowly under over near far blue red green small large old "
         "new quiet loud happy tired").split()


def write_folder(folder: Path) -> None:
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    vocab += [f"w{i}" for i in range(30522 - len(vocab))]
    tokenizer = transformers.BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True,
                                               model_max_length=512)
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                     intermediate_size=1536, vocab_size=len(vocab))
    encoder_dir = folder / "encoder"
    transformers.BertModel(config).save_pretrained(str(encoder_dir))
    tokenizer.save_pretrained(str(encoder_dir))
    body = Transformer(str(encoder_dir), max_seq_length=128)
    SentenceTransformer(modules=[body, Pooling(384, "mean"), Normalize()], device="cpu").save(str(folder / "st"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    import jaxformer as jf

    folder = Path(tempfile.mkdtemp(prefix="jaxformer-embed-"))
    write_folder(folder)
    rng = random.Random(0)
    corpus = [" ".join(rng.choices(WORDS, k=rng.randint(4, 60))) for _ in range(args.sentences)]
    ours = jf.Embedder.from_pretrained(folder / "st")
    theirs = SentenceTransformer(str(folder / "st"), device="cpu")
    sides = {"jaxformer": lambda: ours.encode(corpus, batch_size=args.batch_size),
             "sentence-transformers": lambda: theirs.encode(corpus, batch_size=args.batch_size)}
    with torch.inference_mode():
        vectors = {name: encode() for name, encode in sides.items()}  # warm-up: compiles, allocator
        times = {name: [] for name in sides}
        for _ in range(args.repeats):
            for name, encode in sides.items():
                start = time.perf_counter()
                encode()
                times[name].append(time.perf_counter() - start)
    rate = {name: args.sentences / statistics.median(t) for name, t in times.items()}
    result = {"sentences": args.sentences, "batch_size": args.batch_size, "torch_threads": torch.get_num_threads(),
              "jaxformer_sentences_s": round(rate["jaxformer"], 1),
              "sentence_transformers_sentences_s": round(rate["sentence-transformers"], 1),
              "ratio": round(rate["jaxformer"] / rate["sentence-transformers"], 3),
              "max_abs_diff": float(np.abs(vectors["jaxformer"] - vectors["sentence-transformers"]).max())}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.sentences} sentences of 4-60 words, batch {args.batch_size}, MiniLM-L6 shape, float32")
    for name in sides:
        print(f"  {name:<22} {rate[name]:8.1f} sentences/s  (median of {args.repeats})")
    print(f"  ratio {result['ratio']:.2f}x; largest difference between the two matrices {result['max_abs_diff']:.1e}")


if __name__ == "__main__":
    main()
