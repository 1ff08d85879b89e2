"""The ``jaxformer`` command line: info, train, tokenize, eval, compare, convert, generate, transcribe, predict,
embed, viz, serve."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from jaxformer import kernels
from jaxformer.layer_plan import stack_plans
from jaxformer.models import param_count
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
        width = max(20, *(len(r["name"]) for r in rows))
        header = f"{'preset':<{width}} {'family':<16} {'layers':>7} {'d_model':>8} {'heads q/kv':>11} {'params':>17}"
        print(header)
        print("-" * len(header))
        for r in rows:
            print(f"{r['name']:<{width}} {r['family']:<16} {r['layers']:>7} {r['d_model']:>8} {r['heads']:>11} "
                  f"{r['params']:>17,}")
        return 0
    cfg = config(args.name)
    record = {"name": args.name, "family": cfg.family, "params": param_count(cfg), "config": cfg.to_dict()}
    if cfg.family not in ("encoder", "dual_encoder"):
        record["decode_cache"] = _decode_cache(cfg)
    plans = stack_plans(cfg)  # what each layer of each stack is
    record["layer_plan"] = {stack: [dataclasses.asdict(spec) for spec in plan.layers] for stack, plan in plans.items()}
    if args.json:
        print(json.dumps(record, indent=1))
    else:
        print(f"{args.name}: {cfg.family}, {record['params']:,} parameters")
        if "decode_cache" in record:
            print(f"  decode cache: {record['decode_cache']['summary']}")
        for stack, plan in plans.items():
            print(f"  {stack} layer plan:\n" + "\n".join("    " + line for line in plan.table().splitlines()))
        for key, value in record["config"].items():
            print(f"  {key:<24} {value}")
    return 0


def _decode_cache(cfg) -> dict:
    """What a decoder's self-attention cache holds per row, in bytes of ``cfg.dtype``: per token (the full
    layers; Transformer-XL: its memory window's, which stays at memory_len tokens) and at most (the windowed
    layers' rolling caches)."""
    import jax.numpy as jnp

    from jaxformer.cache import cache_footprint, linear_state_bytes, windowed_layers

    itemsize = jnp.dtype(cfg.dtype).itemsize
    per_token, bounded = (numbers * itemsize for numbers in cache_footprint(cfg))
    state = linear_state_bytes(cfg)
    local, window = windowed_layers(cfg, cfg.decoder_layers)
    kind = "latents" if cfg.mla else "keys and values"
    size = lambda n: f"{n:,} bytes" if n < 2**20 else f"{n / 2**20:,.1f} MiB"  # noqa: E731
    if cfg.position == "xl":
        summary = f"{size(per_token)} per token of memory ({kind}, {cfg.dtype}" + (
            f"; {cfg.segment_memory} tokens kept)" if cfg.segment_memory else ")")
    elif bounded:
        full, windowed = local.count(False), local.count(True)
        rings = f"at most {size(bounded)} in the rolling caches of {windowed} windowed layers ({window} slots each)"
        summary = (f"{size(per_token)} per token ({kind}, {cfg.dtype}, {full} full layer{'s' * (full != 1)}) + {rings}"
                   if full else f"{rings}, {cfg.dtype}: nothing grows with the length")
    else:
        summary = f"{size(per_token)} per token ({kind}, {cfg.dtype})"
    if cfg.scores.compressed is not None:  # DeepSeek-V4: compressed entries grow; windows and open blocks do not
        compressed = sum(kind != "sliding" for kind in cfg.scores.compressed.layers)
        summary = (f"{size(per_token)} per token (compressed entries of {compressed} compressed layers, {cfg.dtype}) + "
                   f"at most {size(bounded)} in every layer's last {cfg.window_size - 1} keys of its window (which are "
                   "its values) and the compressors' last blocks of projected tokens and gates")
    if state:  # the linear layers' state matrices and convolution windows: the same at any length
        linear = len(cfg.linear_attention.layers)
        full = cfg.decoder_layers - linear
        summary = (f"{size(per_token)} per token ({kind}, {cfg.dtype}, {full} attention layer{'s' * (full != 1)}) + "
                   f"{size(state)} of state in {linear} linear layers, whatever the length")
    return {"bytes_per_token": per_token, "windowed_bytes_at_most": bounded, "linear_state_bytes": state,
            "summary": summary}


def compare(args: argparse.Namespace) -> int:
    import numpy as np

    from jaxformer.compare import compare as run_compare
    from jaxformer.compare import format_table

    _refuse_run_folder(args.path, "compare")
    if args.input_ids is None and args.text is None and args.image is None and args.audio is None:
        raise ValueError("compare needs an input: --text, --input-ids, --image (an image model's) or --audio "
                         "(Whisper's: --input-ids or --text then give the decoder's ids)")
    if args.image is not None and args.audio is not None:
        raise ValueError("compare reads --image (an image model's input) or --audio (Whisper's), not both")
    ids, images, model = None, {}, None
    if args.input_ids is not None:
        try:
            ids = np.array([[int(t) for t in args.input_ids.split(",")]])
        except ValueError:
            raise ValueError(f"--input-ids {args.input_ids!r} must be comma-separated integers") from None
    elif args.text is not None:
        from jaxformer.interop.tokenizer import load_tokenizer

        ids = load_tokenizer(args.path)(args.text)["input_ids"]
    if args.image is not None:
        model, ids, images = _image_inputs(args, ids)
    if args.audio is not None:  # the features' own row first, then the model's from them
        from jaxformer.compare import audio_features

        features, features_row = audio_features(args.path, args.audio)
        rows = [features_row, *run_compare(args.path, None, decoder_input_ids=ids, dtype=args.dtype,
                                           input_features=features)]
    else:
        rows = run_compare(args.path, ids, dtype=args.dtype, model=model, **images)
    print(format_table(rows, args.tolerance))
    return 0 if all(r.max_abs <= args.tolerance for r in rows) else 1


def _image_inputs(args: argparse.Namespace, ids) -> tuple:
    """(model, input ids, compare's image arguments) for ``compare --image``. An image tower reads the image alone,
    prepared by the folder's own image processor (its preprocessor_config.json): pixel_values, and NaFlex's
    (SigLIP2's) pixel_attention_mask and spatial_shapes where it gives them. A decoder reading images (LLaVA,
    Qwen2.5-VL, Gemma 3, Llama 3.2 Vision) reads the prompt ``--text`` with the image's placeholder expanded, as
    transformers' processor expands it, beside the pixels (and the other inputs its processor gives, as compare's
    image_inputs)."""
    from jaxformer.interop.hf import from_pretrained
    from jaxformer.interop.tokenizer import load_tokenizer
    from jaxformer.vision import ImageProcessor, read_image
    from jaxformer.vision.loading import refuse_unprepared_images

    model = from_pretrained(args.path, dtype=args.dtype)
    cfg = model.config
    if cfg.family == "decoder" and cfg.vision is not None:
        if args.text is None:
            raise ValueError(f"compare --image on {args.path} (a decoder reading images) needs --text, the prompt "
                             "holding the image's placeholder, e.g. --text 'USER: <image> What is this? ASSISTANT:'")
        batch, images = _image_batch(args.path, model, load_tokenizer(args.path), [args.text], [args.image])
        pixel_values = images.pop("pixel_values")
        return model, batch["input_ids"], dict(pixel_values=pixel_values, image_inputs=images or None)
    refuse_unprepared_images(cfg, args.path, "compare --image")
    out = ImageProcessor.from_pretrained(args.path)([read_image(args.image, "--image")])
    return model, ids, {key: out[key] for key in ("pixel_values", "pixel_attention_mask", "spatial_shapes")
                        if key in out}


def _refuse_run_folder(path: str, command: str) -> None:
    """A train.py run folder where a Hugging Face folder is read: named as such, with the conversion to run."""
    from pathlib import Path

    from jaxformer.train.run import CONFIG_FILE

    if (Path(path) / CONFIG_FILE).exists():
        raise ValueError(f"{path} is a training run folder ({CONFIG_FILE}, checkpoints/); {command} reads a Hugging "
                         f"Face folder: write one with `jaxformer convert {path} --to-hf OUT`, then {command} OUT")


def evaluate(args: argparse.Namespace) -> int:
    from jaxformer.train.evaluate import evaluate as run_evaluation

    metrics = run_evaluation(args.run_dir, args.step, tuple(args.overrides))
    if args.json:
        print(json.dumps(metrics))
    else:
        memory = f" (memory {metrics.pop('memory_len')})" if "memory_len" in metrics else ""
        print(f"{args.run_dir} step {metrics.pop('step')}{memory}: "
              + ", ".join(f"{k.removeprefix('eval_')} {v:.6g}" for k, v in metrics.items()))
    return 0


def convert(args: argparse.Namespace) -> int:
    from pathlib import Path

    from jaxformer.checkpoint import is_checkpoint, load_model, save_model
    from jaxformer.interop.files import write_checkpoint_folder
    from jaxformer.interop.hf import from_pretrained
    from jaxformer.train.evaluate import export_hf
    from jaxformer.train.run import CONFIG_FILE

    source = Path(args.source)
    if (source / CONFIG_FILE).exists():  # a training run folder: its newest (or --step) checkpoint
        if args.to_peft:
            return _run_to_peft(source, args)
        output = args.to_hf or args.output
        if output is None or args.to == "jaxformer":
            raise ValueError(f"{source} is a training run; write it as a Hugging Face folder with --to-hf OUT")
        steps = []
        write_checkpoint_folder(output, lambda folder: steps.append(export_hf(source, folder, args.step, args.merge)),
                                args.overwrite)
        merged = " (LoRA merged)" if args.merge else ""
        print(f"wrote hf checkpoint {output} from step {steps[0]} of {source}{merged} "
              "(config.json + model.safetensors + the run's tokenizer.json)")
        return 0
    if args.to_peft or args.merge:
        raise ValueError(f"--to-peft and --merge read a LoRA training run folder (with {CONFIG_FILE}); {source} is "
                         "not one")
    if args.to_hf:
        args.output, args.to = args.to_hf, "hf"
    if args.output is None:
        raise ValueError("convert needs an output folder (OUTPUT or --to-hf OUT)")
    target = args.to or ("hf" if is_checkpoint(source) else "jaxformer")
    if target == "hf":
        model = load_model(source) if is_checkpoint(source) else from_pretrained(source)
        write_checkpoint_folder(args.output, model.save_pretrained, args.overwrite)
    else:
        model = from_pretrained(source, dtype=args.dtype)
        write_checkpoint_folder(args.output, lambda folder: save_model(model, folder), args.overwrite)
    contents = "config.json + model.safetensors" if target == "hf" else "jaxformer.json + Orbax params"
    print(f"wrote {target} checkpoint {args.output} ({contents})")
    return 0


def _run_to_peft(source, args: argparse.Namespace) -> int:
    """A LoRA training run's adapters (and trained head) as a PEFT adapter folder, for the base it names."""
    from jaxformer.interop.files import write_checkpoint_folder
    from jaxformer.interop.peft import save_adapter
    from jaxformer.train.evaluate import restore_run

    if args.to_hf or args.output or args.merge:
        raise ValueError("--to-peft OUT writes the adapters alone; give no other output (--to-hf, OUTPUT, --merge)")
    run, step = restore_run(source, args.step)
    if run.model.config.lora is None:
        raise ValueError(f"{source} is a full fine-tune (no LoRA adapters); write it with --to-hf OUT")
    write_checkpoint_folder(args.to_peft, lambda folder: save_adapter(run.model, folder), args.overwrite)
    print(f"wrote PEFT adapter {args.to_peft} from step {step} of {source} (base {run.base['source']})")
    return 0


def generate(args: argparse.Namespace) -> int:
    import time

    import jax

    from jaxformer import generate as gen

    model, tokenizer = _generation_source(args.path, args.step, args.dtype)
    assistant = None  # generate.prepare refuses drafting options given without their drafter
    if args.assistant_model:  # a folder without tokenizer.json is taken to share the model's, as transformers does
        assistant, own_tokenizer = _generation_source(args.assistant_model, None, args.dtype, need_tokenizer=False)
        if own_tokenizer is not None:
            _require_same_vocabulary(args.path, tokenizer, args.assistant_model, own_tokenizer)
    drafting = dict(assistant_model=assistant, num_assistant_tokens=args.num_assistant_tokens,
                    num_assistant_tokens_schedule=args.num_assistant_tokens_schedule,
                    prompt_lookup_num_tokens=args.prompt_lookup_num_tokens,
                    max_matching_ngram_size=args.max_matching_ngram_size)
    # decoders continue the prompt's last token: pad on the left; an encoder reads its source from position 0,
    # as transformers' seq2seq tokenizers pad it (an absolute position table sees left padding as a shift)
    forced_bos = gen.FROM_MODEL if args.forced_bos_token_id is None else args.forced_bos_token_id
    languages = _languages(args, tokenizer)
    if args.image:
        batch, images = _image_batch(args.path, model, tokenizer, args.prompt, args.image)
    elif args.src_lang is not None:
        batch, images = tokenizer.pad([languages.encode(text, args.src_lang) for text in args.prompt]), {}
    else:
        batch, images = tokenizer(args.prompt, padding_side="left" if model.config.family == "decoder" else "right"), {}
    if args.tgt_lang is not None:
        forced_bos = languages.target(args.tgt_lang)
    # the checkpoint's EOS and forced BOS/EOS apply as they do in transformers (generate.generation_defaults)
    call_args, gc = gen.prepare(model, batch["input_ids"], batch["attention_mask"], max_new_tokens=args.max_new_tokens,
                                do_sample=args.do_sample, temperature=args.temperature, top_k=args.top_k,
                                top_p=args.top_p, num_beams=args.num_beams, seed=args.seed,
                                forced_bos_token_id=forced_bos,
                                allow_beyond_max_positions=args.allow_beyond_max_positions, **drafting, **images)
    images = gen.loop_images(model, batch["input_ids"], gc, images)  # (prepare checks them, the loop reads these)
    start = time.perf_counter()
    loop = gen.drafted_tokens_jit if gc.draft_tokens else gen.generate_tokens_jit  # drafting also counts its rounds
    compiled = loop.lower(*call_args, config=gc, **images).compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    images.pop("image_grid_thw", None)  # (static: compiled in)
    tokens, steps, bad_step, *rounds = jax.block_until_ready(compiled(*call_args[1:], **images))
    elapsed = time.perf_counter() - start
    out = gen.assemble(model, batch["input_ids"], tokens, steps, bad_step, gc)
    for prompt, row, mask in zip(args.prompt, out, batch["attention_mask"]):  # (as written: placeholders unexpanded)
        if model.config.family == "decoder":  # the row: left padding, the prompt's ids, the new ones
            padding, length = len(mask) - int(mask.sum()), int(mask.sum())
            print(prompt + tokenizer.continuation(row[padding:padding + length], row[padding:]))
        else:
            print(tokenizer.decode(row))
    new = int(steps) * len(args.prompt)
    drafted = f"; {int(steps) / (int(rounds[0]) + 1):.2f} tokens per target step" if rounds else ""
    print(f"[{new} new tokens in {elapsed:.2f} s: {new / elapsed:.1f} tokens/s{drafted}; compile {compile_s:.1f} s]",
          file=sys.stderr)
    return 0


def _languages(args: argparse.Namespace, tokenizer):
    """The folder's ``Languages`` where --src-lang or --tgt-lang asks for them (None where neither does), or a
    ValueError naming what cannot be: a model without language codes, --tgt-lang beside --forced-bos-token-id."""
    from jaxformer.interop.tokenizer import Languages

    if args.src_lang is None and args.tgt_lang is None:
        return None
    if args.tgt_lang is not None and args.forced_bos_token_id is not None:
        raise ValueError("--tgt-lang and --forced-bos-token-id both choose the first token: give one")
    languages = Languages.of(tokenizer, args.path)
    if languages is None:
        raise ValueError(f"{args.path} names no languages (its tokenizer's template holds no language code): "
                         "--src-lang and --tgt-lang are for NLLB, M2M-100 and mBART-50")
    return languages


def _image_batch(folder: str, model, tokenizer, prompts: list[str], images: list[str]) -> tuple[dict, dict]:
    """The batch (input_ids, attention_mask; left padded) of the prompts with each image's placeholder expanded, and
    the image inputs, as the folder's transformers processor gives them (processor_config.json,
    preprocessor_config.json, the tokenizer's image token), named as it names them: LLaVA's pixel_values, Qwen2-VL's
    with image_grid_thw and mm_token_type_ids, Gemma 3's with token_type_ids, Llama 3.2 Vision's with
    aspect_ratio_ids, aspect_ratio_mask and cross_attention_mask. The images fill the placeholders in order across
    the prompts. As that processor, a prompt whose placeholders do not match the images in number is refused (a chat
    template writes them; a raw prompt holds its own)."""
    from pathlib import Path

    import numpy as np

    from jaxformer.train.run import CONFIG_FILE
    from jaxformer.vision import ImagePlaceholders, read_image

    cfg = model.config
    if cfg.family != "decoder" or cfg.vision is None:
        kind = f"{cfg.family} model" if cfg.vision is not None else f"{cfg.family} model that reads no images"
        raise ValueError(f"generate --image needs a decoder with an image tower (LLaVA, Qwen2.5-VL, Gemma 3, Llama "
                         f"3.2 Vision); {folder} holds a {kind} ({cfg.name!r})")
    if (Path(folder) / CONFIG_FILE).exists():
        raise ValueError(f"--image reads a Hugging Face folder's image processor (preprocessor_config.json); {folder} "
                         f"is a training run: write a folder with `jaxformer convert {folder} --to-hf OUT`")
    placeholders = ImagePlaceholders.from_pretrained(folder)
    if placeholders.kind == "llava_next":  # its image_sizes and tiles do not reach the model yet
        raise ValueError(f"--image with a prompt takes LLaVA's, Qwen2.5-VL's, Gemma 3's and Llama 3.2 Vision's images; "
                         f"{folder}'s processor is {placeholders.kind}'s")
    token = placeholders.image_token
    found = [prompt.count(token) for prompt in prompts]
    if sum(found) != len(images):
        raise ValueError(f"the prompts hold {sum(found)} {token} placeholders for {len(images)} --image files; write "
                         f"one {token} where each image goes, in order, e.g. --prompt 'USER: {token} What is this? "
                         "ASSISTANT:' (as transformers' processor, which refuses the mismatch too)")
    pictures = [read_image(path, "--image") for path in images]
    if placeholders.kind == "mllama":  # one list of images per prompt
        ends = np.cumsum(found)
        pictures = [pictures[end - count:end] for count, end in zip(found, ends)]
    inputs = placeholders.image_processor(pictures)
    batch = tokenizer(placeholders.expand(prompts, inputs), padding_side="left")
    image_token_id = cfg.vision.image_token_id
    if placeholders.kind == "qwen2_vl":
        extra = dict(image_grid_thw=inputs["image_grid_thw"],
                     mm_token_type_ids=placeholders.token_type_ids(batch["input_ids"], image_token_id))
    elif placeholders.kind == "gemma3":
        extra = dict(token_type_ids=placeholders.token_type_ids(batch["input_ids"], image_token_id))
    elif placeholders.kind == "mllama":
        extra = dict(aspect_ratio_ids=inputs["aspect_ratio_ids"], aspect_ratio_mask=inputs["aspect_ratio_mask"],
                     cross_attention_mask=placeholders.cross_attention_mask(batch["input_ids"], inputs["num_tiles"],
                                                                            image_token_id))
    else:
        extra = {}
    return batch, {"pixel_values": inputs["pixel_values"], **{k: np.asarray(v) for k, v in extra.items()}}


def _generation_source(path: str, step: int | None, dtype: str | None, need_tokenizer: bool = True):
    """(model, tokenizer) of a Hugging Face folder, or of a train.py run folder: checkpoint ``step`` (default:
    the newest) and the tokenizer its data was read with (the bytes, as ``convert --to-hf`` writes them). The
    tokenizer is None for a Hugging Face folder without one (``has_tokenizer``) unless ``need_tokenizer``."""
    from pathlib import Path

    from jaxformer.interop.hf import from_pretrained
    from jaxformer.interop.tokenizer import has_tokenizer, load_tokenizer
    from jaxformer.train.run import CONFIG_FILE

    if not (Path(path) / CONFIG_FILE).exists():
        if step is not None:
            raise ValueError(f"--step picks a training run's checkpoint; {path} is not a run folder (no {CONFIG_FILE})")
        model = from_pretrained(path, dtype=dtype)
        return model, load_tokenizer(path) if need_tokenizer or has_tokenizer(path) else None
    from jaxformer.train.evaluate import run_tokenizer
    from jaxformer.train.run import load_run_model

    if dtype is not None:
        raise ValueError(f"--dtype casts a Hugging Face folder's weights; {path} is a training run, which generates in "
                         f"the dtypes it trained in (or convert it first: jaxformer convert {path} --to-hf OUT)")
    model = load_run_model(Path(path), step)
    return model, run_tokenizer(path, model.config.vocab_size)


def _require_same_vocabulary(path: str, tokenizer, assistant_path: str, assistant_tokenizer) -> None:
    """Drafts travel as token ids, so the assistant's tokenizer must give every token the target's id.
    transformers takes an assistant with another tokenizer only through its universal assisted decoding
    (generate's tokenizer= and assistant_tokenizer=, re-encoding the drafts as text), which jaxformer has not."""
    ours, theirs = tokenizer.vocabulary(), assistant_tokenizer.vocabulary()
    if ours == theirs:
        return
    token = min(token for token in ours.keys() | theirs.keys() if ours.get(token) != theirs.get(token))
    where = lambda vocabulary: f"id {vocabulary[token]}" if token in vocabulary else "absent"  # noqa: E731
    raise ValueError(f"--assistant-model {assistant_path} has another tokenizer than {path} ({len(theirs)} tokens vs "
                     f"{len(ours)}; {token!r} is {where(theirs)} there, {where(ours)} here): drafts are token ids, "
                     "so the two must share one (transformers pairs different tokenizers only by re-encoding drafts "
                     "as text, its universal assisted decoding, which jaxformer does not implement)")


def predict(args: argparse.Namespace) -> int:
    from jaxformer.train.predict import predict as run_predict

    return run_predict(args)


def embed(args: argparse.Namespace) -> int:
    from jaxformer.embedder import Embedder, ImageTextEmbedder
    from jaxformer.vision import read_image

    if args.image:  # a dual encoder's image tower (ImageTextEmbedder refuses any other folder by name)
        if args.prompt_name is not None or args.batch_size is not None:
            raise ValueError("--prompt-name and --batch-size are a sentence-transformers folder's (its text prompt, "
                             "its batches); --image takes neither: the images run as one batch")
        pictures = [read_image(path, "--image") for path in args.image]
        vectors = ImageTextEmbedder.from_pretrained(args.path, dtype=args.dtype).encode_images(pictures)
    else:
        embedder = Embedder.from_pretrained(args.path, dtype=args.dtype)
        if isinstance(embedder, ImageTextEmbedder):  # CLIP's, SigLIP's text tower: one batch, no prompts
            if args.prompt_name is not None or args.batch_size is not None:
                raise ValueError(f"--prompt-name and --batch-size are a sentence-transformers folder's (its prompts, "
                                 f"its batches); {args.path} is a {embedder.model.config.name} dual encoder, whose "
                                 "texts run as one batch without prompts")
            vectors = embedder.encode(args.text)
        else:
            batches = {} if args.batch_size is None else {"batch_size": args.batch_size}
            vectors = embedder.encode(args.text, prompt_name=args.prompt_name, **batches)
    if args.json:
        print(json.dumps({"embeddings": vectors.tolist()}))
        return 0
    for text, vector in zip(args.text or args.image, vectors):
        shown = " ".join(f"{v:+.4f}" for v in vector[:8])
        print(f"{text!r}: [{shown}{' ...' if len(vector) > 8 else ''}] ({len(vector)} dims)")
    return 0


def tokenize(args: argparse.Namespace) -> int:
    from jaxformer.train.shards import tokenize as write_shards

    summary = write_shards(args.sources, args.tokenizer, args.out, field=args.field, shard_tokens=args.shard_tokens,
                           workers=args.workers, on_error=args.on_error)
    print("\n".join(summary.lines()))
    return 0


def viz(args: argparse.Namespace) -> int:
    from jaxformer import viz as pictures

    return pictures.masks_command(args) if args.picture == "masks" else pictures.attention_command(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:  # train.py's own argument grammar: [CONFIG.yaml] [section.key=value ...]
        from jaxformer.train.lifecycle import Interrupted
        from jaxformer.train.run import main as train_main

        try:
            return train_main(argv[1:])
        except Interrupted as stop:
            print(f"jaxformer: {stop}", file=sys.stderr)
            return stop.exit_code
        except ValueError as err:
            print(f"jaxformer: error: {err}", file=sys.stderr)
            return 2
        except FloatingPointError as err:
            print(f"jaxformer: stopped: {err}", file=sys.stderr)
            return 3
    args = parse(argv)
    try:
        return args.run(args)
    except ValueError as err:
        print(f"jaxformer: error: {err}", file=sys.stderr)
        return 2


def parse(argv: list[str]) -> argparse.Namespace:
    """The arguments of every subcommand but ``train``. ``key=value`` overrides (eval's) may stand after
    flags too, as in ``jaxformer eval RUN --step 200 data.eval=other.txt``, which argparse alone refuses
    (its positionals end at the first flag)."""
    top = argument_parser()
    args, extra = top.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and all("=" in word and not word.startswith("-") for word in extra):
        args.overrides += extra
    elif extra:
        top.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def argument_parser() -> argparse.ArgumentParser:
    """Every subcommand but ``train``, whose arguments are train.py's own grammar."""
    parser = argparse.ArgumentParser(prog="jaxformer", description="The three Transformer families in JAX/Flax.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("train", help="train a model: jaxformer train [CONFIG.yaml] [section.key=value ...]")
    p = commands.add_parser("info", help="list presets, or describe one (parameter count from abstract shapes)")
    p.add_argument("name", nargs="?", help="a preset name; omit to list every preset")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=info)

    p = commands.add_parser("compare", help="per-layer parity of a HF checkpoint: transformers vs jaxformer")
    p.add_argument("path", help="a Hugging Face checkpoint folder")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--text", help="text to tokenize with the folder's tokenizer.json")
    source.add_argument("--input-ids", help="comma-separated token ids, e.g. 1,2,3")
    p.add_argument("--image", help="an image file, prepared by the folder's preprocessor_config.json (ViT, CLIP's "
                   "and SigLIP's vision models need no ids; LLaVA, Qwen2.5-VL, Gemma 3 and Llama 3.2 Vision read it "
                   "beside --text, a prompt holding its placeholder, e.g. <image>)")
    p.add_argument("--audio", help="an audio file (WAV, FLAC, OGG), resampled and turned into log-mel features by the "
                   "folder's preprocessor_config.json (Whisper; --input-ids: the decoder's, default its start token)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--tolerance", type=float, default=1e-5, help="max abs difference allowed (exit 1 above)")
    p.set_defaults(run=compare)

    p = commands.add_parser("eval", help="metrics of a training run's checkpoint on held-out (or given) data")
    p.add_argument("run_dir", help="a train.py run folder (run.dir)")
    p.add_argument("overrides", nargs="*", help="data.*, eval.* or mesh.* overrides, e.g. data.eval=test.jsonl, "
                                                "eval.memory_len=512 (Transformer-XL: a longer memory)")
    p.add_argument("--step", type=int, help="the checkpoint's step (default: the newest)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=evaluate)

    p = commands.add_parser("convert", help="Hugging Face folder <-> jaxformer checkpoint (Orbax), or a "
                                            "training run -> Hugging Face folder")
    p.add_argument("source", help="a Hugging Face folder, a jaxformer checkpoint folder or a training run folder")
    p.add_argument("output", nargs="?", help="the folder to write")
    p.add_argument("--to", choices=["hf", "jaxformer"], help="target format (default: the other one)")
    p.add_argument("--to-hf", metavar="OUT", help="write a Hugging Face folder OUT")
    p.add_argument("--to-peft", metavar="OUT", help="LoRA training runs: write the adapters as a PEFT folder OUT")
    p.add_argument("--merge", action="store_true",
                   help="LoRA training runs with --to-hf: merge the adapters into the base (W + scale * A B)")
    p.add_argument("--step", type=int, help="training runs: the checkpoint's step (default: the newest)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="parameter dtype when importing")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the checkpoint files of a non-empty output folder (and nothing else in it)")
    p.set_defaults(run=convert)

    _generate_command(commands)
    _transcribe_command(commands)

    p = commands.add_parser("predict", help="a fine-tuned run's predictions: entities (token_classification), "
                                            "answer spans (question_answering) or labels (classification)")
    p.add_argument("run_dir", help="a train.py run folder (run.dir)")
    p.add_argument("--text", action="append", required=True,
                   help="the text (question answering: the context); repeat for several")
    p.add_argument("--text-pair", help="classification runs trained on pairs: the second text")
    p.add_argument("--question", help="question-answering runs: the question asked of each --text")
    p.add_argument("--step", type=int, help="the checkpoint's step (default: the newest)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=predict)

    p = commands.add_parser("embed", help="sentence embeddings from a sentence-transformers folder; text or image "
                                          "embeddings from a CLIP or SigLIP folder")
    p.add_argument("path", help="a sentence-transformers folder (modules.json, the pooling config, the encoder), or a "
                                "CLIP or SigLIP Hugging Face folder")
    inputs = p.add_mutually_exclusive_group(required=True)
    inputs.add_argument("--text", action="append", help="a sentence; repeat for several")
    inputs.add_argument("--image", action="append", metavar="PATH",
                        help="CLIP and SigLIP folders: an image file, prepared by the folder's "
                             "preprocessor_config.json (its get_image_features); repeat for several")
    p.add_argument("--batch-size", type=int, help="sentence-transformers folders: texts per batch (default 32)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--prompt-name", help="one of the folder's prompts (config_sentence_transformers.json), e.g. "
                                         "EmbeddingGemma's query or document")
    p.add_argument("--json", action="store_true", help='print {"embeddings": [[...], ...]}')
    p.set_defaults(run=embed)

    _tokenize_command(commands)
    _viz_command(commands)
    _serve_command(commands)
    return parser


def _serve_command(commands) -> None:
    p = commands.add_parser("serve", help="an OpenAI-compatible HTTP server (completions, chat, streaming, metrics) "
                                          "over the serving engine: continuous batching on a paged KV cache; "
                                          "/v1/embeddings for a sentence-transformers, encoder or CLIP/SigLIP folder")
    p.add_argument("path", help="checkpoint folder (config.json, model.safetensors, tokenizer.json; the chat "
                                "template from chat_template.jinja or tokenizer_config.json) or a train.py run folder")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="0: a free port (printed)")
    p.add_argument("--served-model-name", help="the name requests give as model (default: PATH as given)")
    p.add_argument("--max-num-seqs", type=int, default=16,
                   help="sequences decoded together at most (an embedding model: inputs embedded together)")
    p.add_argument("--block-size", type=int, help="tokens a KV-cache block holds (default 16)")
    p.add_argument("--num-blocks", type=int,
                   help="KV-cache blocks in the pool (default: max_num_seqs sequences at max_model_len)")
    p.add_argument("--memory", type=float, metavar="GIB",
                   help="size the pool by memory instead: as many blocks as GIB GiB holds (not with --num-blocks)")
    p.add_argument("--prefill-chunk", type=int,
                   help="prompt tokens a sequence feeds per step at most (default 256; twice that in all)")
    p.add_argument("--max-queue", type=int, default=1024, help="requests waiting at most; more are answered 429")
    p.add_argument("--draft-tokens", type=int, metavar="K",
                   help="greedy and drawing requests draft up to K tokens a step by prompt lookup (or "
                        "--assistant-model), verified in the same step (same output, fewer steps where drafts match; "
                        "default 0: no drafting)")
    p.add_argument("--draft-schedule", choices=("constant", "heuristic"),
                   help="how many of the K each request drafts: constant (default: K), or heuristic (transformers' "
                        "schedule, a request at a time: two more after a step that kept every draft, one fewer, "
                        "down to 1, after one that did not)")
    p.add_argument("--assistant-model", metavar="PATH",
                   help="a smaller decoder sharing the model's tokenizer drafts the --draft-tokens K (its own KV "
                        "pool of the same blocks, counted by --memory)")
    p.add_argument("--paged-attention", choices=kernels.PAGED_CHOICES,
                   help="what the steps read the paged cache by: auto (default: the backend's fused paged kernel "
                        "where it serves the model: pallas-gpu on NVIDIA GPUs and pallas-tpu on TPUs for one-token "
                        "steps of bfloat16 models, ffi-cpu on CPUs for every step of float32 ones, C++ built on "
                        "first use with $CXX; else XLA), xla, or a kernel by name (a Pallas one off its platform in "
                        "Pallas's interpreter, for tests)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1/ routes")
    p.add_argument("--no-warm-up", action="store_true",
                   help="listen at once; each program compiles on first use (the first requests wait for it)")
    p.add_argument("--compilation-cache", metavar="DIR",
                   help="keep compiled programs in DIR (JAX's persistent cache): a restart reads them back")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--matryoshka-dimensions", type=int, nargs="+", metavar="N",
                   help="an embedding model's widths a request may ask for as dimensions (default: config.json's "
                        "matryoshka_dimensions, any width if is_matryoshka, else none)")
    p.set_defaults(run=serve)


# serve's flags that set the generation engine (their argparse defaults are None, so a given one is seen)
GENERATION_ONLY = {"--num-blocks": "num_blocks", "--memory": "memory", "--block-size": "block_size",
                   "--prefill-chunk": "prefill_chunk", "--draft-tokens": "draft_tokens",
                   "--draft-schedule": "draft_schedule", "--assistant-model": "assistant_model",
                   "--paged-attention": "paged_attention"}


def serve(args: argparse.Namespace) -> int:
    import inspect
    from pathlib import Path

    from jaxformer.embedder import Embedder
    from jaxformer.serving.engine import Engine
    from jaxformer.serving.server import serve as run_server

    embedder = None
    if (Path(args.path) / "modules.json").exists():  # a sentence-transformers folder: /v1/embeddings
        embedder = Embedder.from_pretrained(args.path, dtype=args.dtype)
    else:
        model, tokenizer = _generation_source(args.path, None, args.dtype)
        if model.config.family == "encoder" and (Path(args.path) / "config.json").exists():  # a plain encoder:
            embedder = Embedder.from_pretrained(args.path, args.dtype, pooling="mean", model=model)  # as ST reads it
        if model.config.family == "dual_encoder":  # CLIP, SigLIP: texts and images
            from jaxformer.embedder import ImageTextEmbedder
            from jaxformer.vision import ImageProcessor

            if tokenizer is None:
                raise ValueError(f"{args.path} holds no tokenizer (tokenizer.json) for its text tower")
            embedder = ImageTextEmbedder(model, tokenizer, ImageProcessor.from_pretrained(args.path))
    if embedder is not None:
        from jaxformer.serving.embeddings import serve as serve_embeddings

        given = [flag for flag, name in GENERATION_ONLY.items() if getattr(args, name) is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: the generation engine's (its KV cache, prefill, drafting); "
                             f"{args.path} is served as an embedding model, which has none")
        serve_embeddings(embedder, args.served_model_name or args.path, args.host, args.port, args.api_key,
                         args.max_queue, args.max_num_seqs, args.matryoshka_dimensions, not args.no_warm_up,
                         args.compilation_cache)
        return 0
    if args.matryoshka_dimensions is not None:
        raise ValueError(f"--matryoshka-dimensions is an embedding model's; {args.path} is served for generation")
    defaults = inspect.signature(Engine).parameters  # the engine's own defaults where a flag is not given
    settings = {name: defaults[name].default if getattr(args, name) is None else getattr(args, name)
                for name in ("block_size", "prefill_chunk", "draft_tokens", "draft_schedule", "paged_attention")}
    if args.assistant_model:  # (without tokenizer.json: taken to share the model's, as transformers does)
        if args.draft_tokens is None:
            raise ValueError(f"--assistant-model {args.assistant_model}: give --draft-tokens K, the tokens it drafts "
                             "a step")
        settings["draft_model"], own_tokenizer = _generation_source(args.assistant_model, None, args.dtype,
                                                                    need_tokenizer=False)
        if own_tokenizer is not None and tokenizer is not None:
            _require_same_vocabulary(args.path, tokenizer, args.assistant_model, own_tokenizer)
    run_server(model, tokenizer, args.path, args.served_model_name or args.path, args.host, args.port, args.api_key,
               args.max_queue, memory=args.memory, warm_up=not args.no_warm_up,
               compilation_cache=args.compilation_cache, num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs,
               **settings)
    return 0


TRANSCRIPT_SUFFIXES = {"text": ".txt", "json": ".json", "srt": ".srt", "vtt": ".vtt"}


def _transcribe_command(commands) -> None:
    p = commands.add_parser("transcribe", help="speech to text with a Whisper folder: transcripts, JSON segments or "
                                               "SRT/VTT subtitles of audio files")
    p.add_argument("path", help="a Whisper Hugging Face folder (config.json, model.safetensors, "
                                "generation_config.json, preprocessor_config.json, tokenizer.json)")
    p.add_argument("audio", nargs="+", metavar="AUDIO",
                   help="audio files (WAV, FLAC, OGG, ...), resampled to the feature extractor's rate; audio longer "
                        "than one window (30 s) is transcribed window by window, with timestamps")
    p.add_argument("--language", help="the spoken language: a code (en), a name (english) or a token (<|en|>); "
                                      "default: detected per file (multilingual models)")
    p.add_argument("--task", choices=["transcribe", "translate"],
                   help="translate: English text from speech in any language (multilingual models)")
    p.add_argument("--timestamps", action="store_true",
                   help="predict timestamp tokens: segments with their times. Always on for audio longer than one "
                        "window (as transformers' generate and pipeline) and for --format srt/vtt (cues need times); "
                        "without it a window is one segment")
    p.add_argument("--num-beams", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, help="new tokens per window (default: generation_config.json's "
                                                      "max_length, as transformers reads it)")
    p.add_argument("--format", choices=list(TRANSCRIPT_SUFFIXES), default="text",
                   help="text: one line per file; json: one object per file and line (text, segments with start, "
                        "end in seconds and text); srt, vtt: subtitles, one cue per segment")
    p.add_argument("--output", metavar="DIR", help="write NAME.txt, .json, .srt or .vtt per file into DIR (default: "
                                                   "stdout; several files' subtitles need DIR)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    p.set_defaults(run=transcribe)


def transcribe(args: argparse.Namespace) -> int:
    """Each audio file as transformers' Whisper pipeline reads it (one window padded to 30 s, or longer audio's
    features unpadded), ``model.generate`` on it, its tokens decoded by the folder's tokenizer (timestamps left out),
    written out as each file finishes under a progress bar over the files."""
    import os
    from pathlib import Path

    import soundfile
    from tqdm import tqdm

    from jaxformer import speech_generation
    from jaxformer.audio import FeatureExtractor, read_audio
    from jaxformer.interop.hf import from_pretrained
    from jaxformer.interop.tokenizer import load_tokenizer

    _refuse_run_folder(args.path, "transcribe")
    several = len(args.audio) > 1
    if args.output is None and several and args.format in ("srt", "vtt"):
        raise ValueError(f"--format {args.format} writes one subtitle file per audio file: give --output DIR for "
                         f"{len(args.audio)} files (stdout takes one)")
    names = [Path(file).stem for file in args.audio]
    if args.output is not None and len(set(names)) < len(names):
        clash = [file for file, name in zip(args.audio, names) if names.count(name) > 1]
        raise ValueError(f"--output DIR names each transcript after its audio file; {', '.join(clash)} would write "
                         f"the same {Path(clash[0]).stem}{TRANSCRIPT_SUFFIXES[args.format]}")
    for file in args.audio:  # every file checked before the model loads (read_audio reads them one at a time)
        if not os.path.isfile(file):
            raise ValueError(f"audio file {file!r} does not exist")
        try:
            soundfile.info(file)
        except (soundfile.LibsndfileError, RuntimeError) as err:
            raise ValueError(f"{file} is not an audio file soundfile can read (WAV, FLAC, OGG, ...): {err}") from None
    model = from_pretrained(args.path, dtype=args.dtype)
    if model.config.audio is None:
        raise ValueError(f"transcribe reads audio with a Whisper folder; {args.path} holds a {model.config.family} "
                         f"model ({model.config.name!r}) that reads no audio")
    extractor, tokenizer = FeatureExtractor.from_pretrained(args.path), load_tokenizer(args.path)
    no_timestamps = speech_generation.settings(model).get("no_timestamps_token_id")
    # the text leaves out the timestamps (the ids after <|notimestamps|>, which a tokenizer.json may not mark special)
    text_of = lambda tokens: tokenizer.decode(  # noqa: E731
        [t for t in tokens if no_timestamps is None or t <= no_timestamps]).strip()
    timestamps = True if args.timestamps or args.format in ("srt", "vtt") else None  # None: long audio's rule
    if args.output is not None:
        Path(args.output).mkdir(parents=True, exist_ok=True)
    for file, name in zip(tqdm(args.audio, desc="transcribe", unit="file", file=sys.stderr, disable=None), names):
        waveform = read_audio(file, extractor.sampling_rate)
        unpadded = dict(truncation=False, padding="longest") if len(waveform) > extractor.n_samples else {}
        features = extractor(waveform, sampling_rate=extractor.sampling_rate, **unpadded)["input_features"]
        out = model.generate(features, language=args.language, task=args.task, return_timestamps=timestamps,
                             return_segments=True, num_beams=args.num_beams, max_new_tokens=args.max_new_tokens)
        record = {"file": file, "text": text_of(out["sequences"][0]),
                  "segments": [{"start": round(segment["start"], 3), "end": round(segment["end"], 3),
                                "text": text_of(segment["tokens"])} for segment in out["segments"][0]]}
        written = (record["text"].replace("\n", " ") + "\n" if args.format == "text"
                   else json.dumps(record, ensure_ascii=False) + "\n" if args.format == "json"
                   else subtitles(record["segments"], args.format))
        if args.output is None:
            sys.stdout.write(written)
            sys.stdout.flush()
        else:
            (Path(args.output) / f"{name}{TRANSCRIPT_SUFFIXES[args.format]}").write_text(written, encoding="utf-8")
    if args.output is not None:
        print(f"wrote {len(args.audio)} {args.format} transcript{'s' * several} to {args.output}", file=sys.stderr)
    return 0


def subtitles(segments: list[dict], kind: str) -> str:
    """SRT or WebVTT subtitles: one cue per segment holding text (its whitespace runs made single spaces, as a blank
    line would end a cue), from its start to its end; SRT numbers its cues and writes HH:MM:SS,mmm, WebVTT opens
    with its header and writes HH:MM:SS.mmm."""
    separator = "," if kind == "srt" else "."

    def clock(seconds: float) -> str:
        hours, rest = divmod(round(seconds * 1000), 3_600_000)
        minutes, rest = divmod(rest, 60_000)
        return f"{hours:02d}:{minutes:02d}:{rest // 1000:02d}{separator}{rest % 1000:03d}"

    cues = [f"{clock(s['start'])} --> {clock(s['end'])}\n{' '.join(s['text'].split())}\n"
            for s in segments if s["text"].strip()]
    if kind == "srt":
        return "\n".join(f"{number}\n{cue}" for number, cue in enumerate(cues, start=1))
    return "WEBVTT\n\n" + "\n".join(cues)


def _generate_command(commands) -> None:
    p = commands.add_parser("generate", help="generate text from a Hugging Face checkpoint folder (with "
                                             "tokenizer.json) or a train.py run folder")
    p.add_argument("path", help="checkpoint folder (config.json, model.safetensors, tokenizer.json) or a train.py "
                                "run folder (run.dir)")
    p.add_argument("--step", type=int, help="run folders: the checkpoint's step (default: the newest)")
    p.add_argument("--prompt", action="append", required=True, help="prompt text; repeat for a batch")
    p.add_argument("--image", action="append", metavar="PATH",
                   help="an image file for a model that reads images (LLaVA, Qwen2.5-VL, Gemma 3, Llama 3.2 "
                        "Vision): each fills the next image placeholder of the prompts (<image>, <|image_pad|>, "
                        "<start_of_image>, <|image|>), prepared as the folder's processor does; repeat for several")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--allow-beyond-max-positions", action="store_true",
                   help="rotary and relative models: generate past the max_positions they were configured for")
    p.add_argument("--do-sample", action="store_true")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--num-beams", type=int, default=1)
    p.add_argument("--forced-bos-token-id", type=int,
                   help="the token every output starts with (translation: the target language's, as M2M-100, NLLB "
                        "and mBART-50 take it; default: the checkpoint's)")
    p.add_argument("--src-lang", metavar="CODE",
                   help="translation models that name their languages (NLLB: deu_Latn, M2M-100: de, mBART-50): "
                        "the prompts' language, its code put where the tokenizer puts it (default: the folder's)")
    p.add_argument("--tgt-lang", metavar="CODE",
                   help="the language to translate into: its code's token forced first (--forced-bos-token-id "
                        "by name)")
    p.add_argument("--assistant-model", metavar="PATH",
                   help="speculative decoding: a smaller checkpoint (or run) folder with the same tokenizer drafts "
                        "tokens that the model verifies several at a time (greedy output unchanged)")
    p.add_argument("--num-assistant-tokens", type=int, help="drafts per round (default 5)")
    p.add_argument("--num-assistant-tokens-schedule", choices=["adaptive", "constant", "heuristic"],
                   help="how many a drafting round drafts: adaptive (the default: from the acceptance so far and "
                        "the costs measured on this device, plain steps where drafting does not pay), constant "
                        "(always the bound), heuristic (transformers': +2 after a fully kept round, else -1)")
    p.add_argument("--prompt-lookup-num-tokens", type=int,
                   help="prompt lookup decoding: draft this many tokens from n-gram matches in the prompt")
    p.add_argument("--max-matching-ngram-size", type=int, help="longest n-gram prompt lookup matches (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    p.set_defaults(run=generate)


def _tokenize_command(commands) -> None:
    p = commands.add_parser("tokenize", help="tokenize a corpus once into memory-mappable token shards "
                                             "(resumable; rerun with more sources to append)")
    p.add_argument("sources", nargs="+", metavar="SRC",
                   help=".txt (blank-line separated documents), .jsonl, .jsonl.gz, .jsonl.zst, .parquet, .arrow "
                        "files, globs, directories, or a datasets folder written by save_to_disk")
    p.add_argument("--tokenizer", required=True, help="bytes, or a tokenizer.json (or its folder), as data.tokenizer")
    p.add_argument("--out", required=True, help="the shard folder (new, or one this command wrote)")
    p.add_argument("--field", default="text", help="the text field of JSONL records and parquet/arrow rows")
    p.add_argument("--shard-tokens", type=int, default=50_000_000,
                   help="a shard closes at the first document end at or past this many tokens")
    p.add_argument("--workers", type=int, help="tokenizing processes (default: every core; this process alone "
                                                "for under a megabyte per core)")
    p.add_argument("--on-error", choices=["stop", "skip"], default="stop",
                   help="a bad unit (malformed JSON, missing field, undecodable byte, empty file) stops the run, "
                        "or is skipped and counted")
    p.set_defaults(run=tokenize)


def _viz_command(commands) -> None:
    p = commands.add_parser("viz", help="pictures (PNG): the families' visibility masks, a model's attention maps")
    pictures = p.add_subparsers(dest="picture", required=True)
    q = pictures.add_parser("masks", help="one labelled heatmap per visibility pattern, from the models' mask code")
    q.add_argument("--out", required=True, help="the folder to write the PNGs into")
    q.add_argument("--length", type=int, default=12, help="tokens per sequence in the pictures")
    q = pictures.add_parser("attention", help="a model's attention weights on a text, tokens on both axes; or an "
                                              "image model's over an image's patches, laid over the image")
    q.add_argument("checkpoint", help="a Hugging Face folder (with tokenizer.json) or a train.py run folder")
    q.add_argument("--text", help="the text to read (LLaVA with --image: the prompt, holding the image placeholder)")
    q.add_argument("--image", metavar="PATH",
                   help="an image tower's (ViT, CLIP, SigLIP), LLaVA's or Gemma 3's image: the class token's "
                        "attention over the patches (towers without one: the mean over every query; LLaVA, Gemma 3: "
                        "the prompt's last text token's over the image tokens)")
    q.add_argument("--layer", type=int, help="one layer (default: the last)")
    q.add_argument("--head", type=int, help="one head (default: a grid of every head)")
    q.add_argument("--stack", choices=["encoder", "decoder", "cross"],
                   help="encoder-decoders: which attention to draw (default: the encoder's)")
    q.add_argument("--target", help="encoder-decoders: the decoder's text after its start token (default: --text)")
    q.add_argument("--out", required=True, help="the PNG to write")
    p.set_defaults(run=viz)


if __name__ == "__main__":
    sys.exit(main())
