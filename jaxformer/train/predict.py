"""``jaxformer predict RUN_DIR --text ...``: what a fine-tuned run's model says about new text, by its objective:
the entities of a token_classification (NER) run, the label of a classification run (with its probabilities
under --json), the answer spans of a question_answering run (``squad.predict_answers``).

The model, its label names (``ModelConfig.label_names``, kept in model.json), the tokenizer and the length
come from the run folder alone: the training data is not read again (except for a LoRA run, whose frozen base
is loaded from its source the way ``jaxformer eval`` does).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np

from jaxformer import checks
from jaxformer.model_config import ModelConfig
from jaxformer.train import data, squad
from jaxformer.train.objectives import longest_first
from jaxformer.train.evaluate import restore_run
from jaxformer.train.run import CONFIG_FILE, MODEL_FILE, TOKENIZER_FILE, Run, load_run_model
from jaxformer.train.run_config import load
from jaxformer.train.tagging import entities, word_spans, word_starts

OBJECTIVES = ("token_classification", "classification", "question_answering")


def run_settings(run_dir: str | Path):
    """The run config of a run folder (read with the folder's own tokenizer), refused unless its objective is one
    predict reads."""
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG_FILE).exists() or not (run_dir / MODEL_FILE).exists():
        raise ValueError(f"{run_dir} is not a training run folder (no {CONFIG_FILE} or {MODEL_FILE})")
    own = run_dir / TOKENIZER_FILE
    cfg = load(run_dir / CONFIG_FILE, [f"data.tokenizer={own if own.exists() else 'bytes'}", f"run.dir={run_dir}"])
    if cfg.train.objective not in OBJECTIVES:
        raise ValueError(f"{run_dir} trained train.objective={cfg.train.objective!r}; predict reads runs of "
                         f"{', '.join(OBJECTIVES)} (use `jaxformer eval` or `generate` for the others)")
    return cfg


def load_for_prediction(run_dir: str | Path, step: int | None = None):
    """(model with checkpoint ``step``'s parameters (default: the newest), tokenizer) of a run folder; in place
    of the tokenizer, the rebuilt ``Run`` of a LoRA or question-answering run."""
    cfg, run_dir = run_settings(run_dir), Path(run_dir)
    trained = ModelConfig.from_dict(json.loads((run_dir / MODEL_FILE).read_text(encoding="utf-8")))
    if trained.lora is not None or cfg.train.objective == "question_answering":
        # The run rebuilt as `jaxformer eval` does: a LoRA run's adapters need their frozen base, and answer
        # spans are windowed and decoded by the run's own objective (squad.predict_answers reads it).
        run, _ = restore_run(run_dir, step)
        return run.model, run
    return load_run_model(run_dir, step), data.make_tokenizer(cfg.data.tokenizer)


def _label_names(model) -> list[str]:
    cfg = model.config
    options = cfg.head_options
    return list(options.label_names) if options.label_names else [str(i) for i in range(options.num_labels)]


def tag_entities(model, tokenizer, seq_len: int, text: str) -> tuple[list[dict], int]:
    """The entities of ``text`` (type, text, character start and end, score: the mean probability of their
    words' tags) and how many of its words did not fit ``seq_len`` tokens (left untagged)."""
    names = model.config.head_options.label_names
    if not names:
        raise ValueError("this token-classification model has no label_names (a run from before they were kept in "
                         "model.json); retrain it to predict entities by name")
    spans = word_spans(text)
    if not spans:
        return [], 0
    ids, first = word_starts(tokenizer, text, spans)
    ids = ids[:seq_len - 2]
    fits = (first >= 0) & (first < len(ids))
    row = np.concatenate([[tokenizer.special("bos")], ids, [tokenizer.special("eos")]]).astype(np.int32)
    logits = model(row[None]).logits[0]
    probs = np.asarray(jax.nn.softmax(logits.astype(np.float32), axis=-1))
    words = [i for i in range(len(spans)) if fits[i]]
    tags = [names[int(np.argmax(probs[first[i] + 1]))] for i in words]
    scores = [float(np.max(probs[first[i] + 1])) for i in words]
    found = []
    for kind, begin, end in entities(tags):
        start, stop = spans[words[begin]][0], spans[words[end]][1]
        found.append({"type": kind, "text": text[start:stop], "start": start, "end": stop,
                      "score": round(float(np.mean(scores[begin:end + 1])), 4)})
    return found, len(spans) - len(words)


def classify(model, tokenizer, seq_len: int, text: str, text_pair: str | None) -> dict:
    """The label of ``text`` (or of the pair), with every label's probability."""
    cls, sep = tokenizer.special("bos"), tokenizer.special("eos")
    a = tokenizer.encode(text)
    if text_pair is None:
        row, types = np.concatenate([[cls], a[:seq_len - 2], [sep]]), None
    else:
        a, b = longest_first(a, tokenizer.encode(text_pair), seq_len - 3)
        row = np.concatenate([[cls], a, [sep], b, [sep]])
        types = np.concatenate([np.zeros(len(a) + 2), np.ones(len(b) + 1)]).astype(np.int32)[None]
    if not model.config.embeddings.types:
        types = None
    # (an encoder-decoder classifier takes no token types: its decoder reads the row shifted right)
    typed = {} if model.config.family == "encoder_decoder" else {"token_type_ids": types}
    logits = model(row.astype(np.int32)[None], **typed).logits[0]
    probs = np.asarray(jax.nn.softmax(logits.astype(np.float32)))
    names = _label_names(model)
    return {"label": names[int(np.argmax(probs))],
            "probabilities": {name: round(float(p), 6) for name, p in zip(names, probs)}}


def predict(args) -> int:
    for text in args.text:
        checks.require_text(text, "--text")
    checks.require_text(args.text_pair, "--text-pair")
    checks.require_text(args.question, "--question")
    cfg = run_settings(args.run_dir)
    objective, seq_len = cfg.train.objective, cfg.train.seq_len
    if args.text_pair is not None and objective != "classification":
        raise ValueError(f"--text-pair is for classification runs; {args.run_dir} trained {objective!r}")
    if (args.question is not None) != (objective == "question_answering"):
        raise ValueError(f"--question is for question_answering runs, which need it; {args.run_dir} trained "
                         f"{objective!r}")
    model, loaded = load_for_prediction(args.run_dir, args.step)
    tokenizer = loaded.objective.tokenizer if isinstance(loaded, Run) else loaded
    results = []
    if objective == "token_classification":
        for text in args.text:
            found, untagged = tag_entities(model, tokenizer, seq_len, text)
            if untagged:
                print(f"note: {untagged} words past train.seq_len={seq_len} tokens were not tagged", file=sys.stderr)
            results.append({"text": text, "entities": found})
    elif objective == "classification":
        results = [{"text": text, **({"text_pair": args.text_pair} if args.text_pair is not None else {}),
                    **classify(model, tokenizer, seq_len, text, args.text_pair)} for text in args.text]
    else:
        answers = squad.predict_answers(loaded, model, args.question, list(args.text))
        results = [{"text": text, "answer": answer} for text, answer in zip(args.text, answers)]
    if args.json:
        print(json.dumps({"objective": objective, "predictions": results}))
        return 0
    for result in results:
        print(result["text"] + (f"  ||  {result['text_pair']}" if "text_pair" in result else ""))
        if objective == "token_classification":
            for e in result["entities"] or [{"type": "(no entities)", "text": "", "start": "", "end": ""}]:
                where = f"[{e['start']}, {e['end']})" if e["text"] else ""
                print(f"  {e['type']:<6} {e['text']:<28} {where}".rstrip())
        elif objective == "classification":
            print(f"  {result['label']} ({result['probabilities'][result['label']]:.3f})")
        else:
            answer = result["answer"]
            score = "no valid span" if answer["score"] is None else f"score {answer['score']:.3f}"
            print(f"  {answer['text']!r} [{answer['start']}, {answer['end']}) {score}")
    return 0

