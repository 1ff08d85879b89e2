"""Whisper's generate, as transformers' ``WhisperForConditionalGeneration.generate``: the decoder prompt
<|startoftranscript|> <|lang|> <|task|> [<|notimestamps|>] (the language forced, or detected per row from the first
decoder step), ``generation_config.json``'s suppressed tokens and timestamp rules (``generate.process_logits``), and
transformers' sequential windows: each window of 30 s (``2 * max_source_positions`` frames) from ``seek`` on is
generated, cut into segments at its timestamp tokens, and the next window starts at its last complete segment's end
(or past the window, when it ends on a lone timestamp or holds none). Short audio is the one window (which a model
emitting timestamp pairs may also walk past, as in transformers).

The result is transformers': the tokens each row generated, without the prompt and the EOS, its windows' tokens
joined and right-padded with the pad id ([B, T]); with ``return_segments``, also each row's segments, each its start
and end in seconds and its tokens. Decode a segment's tokens with the tokenizer (skipping special tokens) for its text.

Drafting (``assistant_model``, as distil-whisper is used): the assistant, a smaller Whisper of the same vocabulary,
drafts each window's tokens and the model verifies them in one cached step (``generate._drafted``), with the same
suppression and timestamp rules on both, so the output is plain greedy's token for token. With
``assistant_shares_encoder`` the assistant reads the model's encoding of the audio rather than encoding it again,
refused unless its encoder is the model's (config and weights, ``generate.check_shared_encoder``). Unlike
transformers, whose assisted Whisper generate drops the begin-suppress list (so its first token may differ from its
plain greedy's), drafting keeps every rule of plain generation.

Not implemented, refused by name: temperature fallback (a tuple of temperatures and the thresholds that trigger it),
condition_on_prev_tokens, token-level timestamps, prompt lookup drafting.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import numpy as np
from flax import nnx

from jaxformer import checks, generate as generation
from jaxformer.model_config import ModelConfig

# Whisper's languages (code: name), as its tokenizer lists them; names, their aliases or codes name a language
LANGUAGES = dict(pair.split(":") for pair in (
    "en:english,zh:chinese,de:german,es:spanish,ru:russian,ko:korean,fr:french,ja:japanese,pt:portuguese,"
    "tr:turkish,pl:polish,ca:catalan,nl:dutch,ar:arabic,sv:swedish,it:italian,id:indonesian,hi:hindi,fi:finnish,"
    "vi:vietnamese,he:hebrew,uk:ukrainian,el:greek,ms:malay,cs:czech,ro:romanian,da:danish,hu:hungarian,ta:tamil,"
    "no:norwegian,th:thai,ur:urdu,hr:croatian,bg:bulgarian,lt:lithuanian,la:latin,mi:maori,ml:malayalam,cy:welsh,"
    "sk:slovak,te:telugu,fa:persian,lv:latvian,bn:bengali,sr:serbian,az:azerbaijani,sl:slovenian,kn:kannada,"
    "et:estonian,mk:macedonian,br:breton,eu:basque,is:icelandic,hy:armenian,ne:nepali,mn:mongolian,bs:bosnian,"
    "kk:kazakh,sq:albanian,sw:swahili,gl:galician,mr:marathi,pa:punjabi,si:sinhala,km:khmer,sn:shona,yo:yoruba,"
    "so:somali,af:afrikaans,oc:occitan,ka:georgian,be:belarusian,tg:tajik,sd:sindhi,gu:gujarati,am:amharic,"
    "yi:yiddish,lo:lao,uz:uzbek,fo:faroese,ht:haitian creole,ps:pashto,tk:turkmen,nn:nynorsk,mt:maltese,"
    "sa:sanskrit,lb:luxembourgish,my:myanmar,bo:tibetan,tl:tagalog,mg:malagasy,as:assamese,tt:tatar,haw:hawaiian,"
    "ln:lingala,ha:hausa,ba:bashkir,jw:javanese,su:sundanese,yue:cantonese"
).split(","))
LANGUAGE_CODES = {**{name: code for code, name in LANGUAGES.items()}, "burmese": "my", "valencian": "ca",
                  "flemish": "nl", "haitian": "ht", "letzeburgesch": "lb", "pushto": "ps", "panjabi": "pa",
                  "moldavian": "ro", "moldovan": "ro", "sinhalese": "si", "castilian": "es", "mandarin": "zh"}
TASKS = ("translate", "transcribe")
# generation_config.json keys of what is not implemented here: refused when set (to anything but their default)
UNSUPPORTED_SETTINGS = {"condition_on_prev_tokens": (None, False), "logprob_threshold": (None,),
                        "compression_ratio_threshold": (None,), "no_speech_threshold": (None,)}
# generation_config.json's generation defaults this generate applies as transformers' Whisper does
APPLIED_SETTINGS = ("suppress_tokens", "begin_suppress_tokens", "max_length")
TIME_PRECISION = 0.02  # seconds per timestamp token, and per input frame (transformers' defaults)
FRAME_SECONDS = 0.01


def settings(model) -> dict[str, Any]:
    """The model's generation_config.json, its unsupported settings refused; without one, config.json (whose keys
    transformers then takes as the generation config's, Whisper's among them)."""
    saved = json.loads(getattr(model, "generation_config", None) or getattr(model, "hf_config", None) or "{}")
    for key, defaults in UNSUPPORTED_SETTINGS.items():
        if saved.get(key) not in defaults:
            raise ValueError(f"generation_config.json sets {key}={saved[key]!r}, which jaxformer's Whisper generate "
                             "does not implement (no temperature fallback, no conditioning on previous windows)")
    return saved


def language_id(language: str, lang_to_id: dict[str, int]) -> int:
    """A language's token id: ``language`` a token ('<|en|>'), a code ('en') or a name ('english'), any case."""
    language = language.lower()
    token = (language if language in lang_to_id else f"<|{LANGUAGE_CODES[language]}|>" if language in LANGUAGE_CODES
             else f"<|{language}|>" if language in LANGUAGES else None)
    if token is None:
        raise ValueError(f"language={language!r} is not a Whisper language; give a code ('en'), a name ('english') or "
                         f"a token ('<|en|>')")
    if token not in lang_to_id:
        raise ValueError(f"language {token} is not in this model's generation_config.json lang_to_id")
    return lang_to_id[token]


def detect_language(model, input_features, saved: dict[str, Any] | None = None) -> np.ndarray:
    """Each row's language token [B], as transformers' ``detect_language``: the first decoder step's logits after
    <|startoftranscript|> over the first window's frames, their argmax among ``lang_to_id``'s tokens."""
    saved = settings(model) if saved is None else saved
    if not saved.get("lang_to_id"):
        raise ValueError("language detection needs generation_config.json's lang_to_id (a multilingual Whisper)")
    features = np.asarray(input_features)[:, :, :model.config.audio.frames]
    start = generation.generation_defaults(model)["decoder_start_token_id"]
    logits = np.asarray(model(decoder_input_ids=np.full((features.shape[0], 1), start),
                              input_features=_padded(features, model.config.audio.frames)).logits[:, -1])
    languages = np.asarray(sorted(saved["lang_to_id"].values()))
    return languages[np.argmax(logits[:, languages], axis=-1)]


def _padded(features: np.ndarray, frames: int) -> np.ndarray:
    """Features cut from a window, zero-padded at the end to the ``frames`` the encoder reads."""
    return np.pad(features, ((0, 0), (0, 0), (0, frames - features.shape[-1])))


def prompt_tokens(model, input_features, saved: dict[str, Any], language, task, return_timestamps: bool,
                  rows: int) -> np.ndarray:
    """Each row's decoder prompt [B, P] as transformers' ``_retrieve_init_tokens``: the start token, then the
    language (forced, or from generation_config.json's legacy forced_decoder_ids, or detected), the task, and
    <|notimestamps|> unless timestamps are asked for."""
    start = generation.generation_defaults(model)["decoder_start_token_id"]
    tokens: list[Any] = [start]
    if task is None and language is None:  # the legacy forced_decoder_ids count only then
        forced = saved.get("forced_decoder_ids") or json.loads(getattr(model, "hf_config", None) or "{}").get(
            "forced_decoder_ids")
        if forced and forced[0][0] == 1:
            for position, (index, token) in enumerate(forced, start=1):
                if index != position:
                    raise ValueError(f"generation_config.json's forced_decoder_ids={forced} do not follow Whisper's "
                                     "prompt (positions 1, 2, ... in turn)")
                tokens.append(token)
    if isinstance(language, (list, tuple)):
        if len(language) != rows or any(item is None for item in language):
            raise ValueError(f"language lists one language per row: {rows} strings, got {language!r}")
        languages = list(language)
    else:
        languages = [language] * rows
    per_row = [list(tokens) for _ in range(rows)]
    detected = None
    if language is not None:
        detected = [language_id(item, saved.get("lang_to_id") or {}) for item in languages]
    elif "lang_to_id" in saved and (len(tokens) <= 1 or tokens[1] is None):
        detected = detect_language(model, input_features, saved).tolist()
    if detected is not None:
        for row, lang in zip(per_row, detected):
            row[1:2] = [lang]
    task_ids = saved.get("task_to_id") or {}
    no_timestamps = saved.get("no_timestamps_token_id")
    for row in per_row:
        if task is not None:
            row.append(task_ids[task])  # (transformers appends it, whatever task the legacy ids held)
        elif language is not None and task_ids and not any(t in row for t in task_ids.values()):
            row.append(task_ids["transcribe"])
        if not return_timestamps and no_timestamps is not None and row[-1] != no_timestamps:
            row.append(no_timestamps)
        elif return_timestamps and row[-1] == no_timestamps:
            row.pop()
        row[:] = [t for t in row if t is not None]
    return np.asarray(per_row, np.int64)


def generate(model, input_features, *, attention_mask=None, language=None, task: str | None = None,
             is_multilingual: bool | None = None, return_timestamps: bool | None = None, prompt_ids=None,
             max_new_tokens: int | None = None, num_beams: int = 1, temperature: float | None = None,
             top_k: int | None = None, top_p: float | None = None, length_penalty: float = 1.0,
             early_stopping: bool | str = False, seed: int = 0, return_segments: bool = False,
             time_precision: float = TIME_PRECISION, time_precision_features: float = FRAME_SECONDS,
             assistant_model=None, num_assistant_tokens: int | None = None,
             num_assistant_tokens_schedule: str | None = None, draft_costs: tuple[float, float] | None = None,
             assistant_shares_encoder: bool = False, **unsupported):
    """transformers' Whisper ``generate`` on ``input_features`` [B, mel_bins, frames] (any number of frames; more
    than one window's is long-form audio, whose rows then need ``attention_mask`` [B, frames] when B > 1).

    ``language``: None (detected per row on a multilingual model, or generation_config.json's), a code, name or token,
    or one per row; ``task``: 'transcribe' or 'translate'; ``return_timestamps`` (long-form: always); ``prompt_ids``:
    previous text ([<|startofprev|>, tokens...]) put before every window's prompt; ``max_new_tokens`` per window (None:
    generation_config.json's max_length as transformers reads it); ``num_beams``, ``length_penalty``,
    ``early_stopping``; ``temperature`` > 0 samples (with ``top_k``, ``top_p``, ``seed``), as transformers' one
    temperature does. ``assistant_model`` drafts (greedy or sampled, one sequence a row): up to
    ``num_assistant_tokens`` a round (default 5), ``num_assistant_tokens_schedule`` 'constant' (default), 'heuristic',
    or 'adaptive' with ``draft_costs``; ``assistant_shares_encoder`` (see the module). Returns the tokens [B, T] (see
    the module), or with ``return_segments`` a dict of ``sequences`` and ``segments``: per row a list of {'start',
    'end' (seconds), 'tokens'}."""
    cfg: ModelConfig = model.config
    saved = settings(model)
    refused = {name: value for name, value in unsupported.items() if value is not None}
    if refused:
        raise ValueError(f"Whisper generate does not take {', '.join(sorted(refused))} (not implemented here: no "
                         "temperature fallback, condition_on_prev_tokens, token-level timestamps or prompt lookup "
                         "drafting; sampling is temperature=..., not do_sample)")
    if assistant_model is None and (num_assistant_tokens is not None or num_assistant_tokens_schedule is not None
                                    or draft_costs is not None or assistant_shares_encoder):
        raise ValueError("num_assistant_tokens, num_assistant_tokens_schedule, draft_costs and "
                         "assistant_shares_encoder go with an assistant_model")
    if assistant_model is not None:
        generation.check_assistant(model, assistant_model)
        if assistant_model.config.audio != cfg.audio:
            raise ValueError("assistant_model reads other audio features than the model (its num_mel_bins or "
                             "max_source_positions differ): it cannot draft for it")
        if assistant_model.config.max_positions < cfg.max_positions:
            raise ValueError(f"assistant_model has {assistant_model.config.max_positions} decoder positions "
                             f"(max_target_positions), fewer than the model's {cfg.max_positions}: it could not draft "
                             "every token the model may write")
        if assistant_shares_encoder:
            generation.check_shared_encoder(model, assistant_model)
    if isinstance(temperature, (list, tuple)):
        raise ValueError(f"temperature={temperature!r}: temperature fallback (a list of temperatures) is not "
                         "implemented; pass one temperature (0 or None: greedy or beams)")
    features = np.asarray(input_features)
    if (features.ndim != 3 or features.shape[1] != cfg.audio.mel_bins or not features.shape[2]
            or not np.issubdtype(features.dtype, np.floating)):
        raise ValueError(f"input_features has shape {features.shape} ({features.dtype}); Whisper generate reads "
                         f"[batch, {cfg.audio.mel_bins}, frames >= 1] floats")
    rows, frames, window = features.shape[0], features.shape[-1], cfg.audio.frames
    short = frames <= window
    if return_timestamps is None:
        return_timestamps = saved.get("return_timestamps")
    if not short:
        if return_timestamps is False:
            raise ValueError(f"input_features hold {frames} frames, more than one window's {window} (long-form "
                             "audio), which is transcribed with timestamps: pass return_timestamps=True or None")
        return_timestamps = True  # long-form windows move by the timestamps
    return_timestamps = bool(return_timestamps)
    if return_timestamps and saved.get("no_timestamps_token_id") is None:
        raise ValueError("timestamps (return_timestamps, or audio longer than one window) need "
                         "generation_config.json's no_timestamps_token_id")
    multilingual = saved.get("is_multilingual") if is_multilingual is None else is_multilingual
    language = saved.get("language") if language is None else language
    task = saved.get("task") if task is None else task
    if multilingual is False and (language is not None or task is not None):
        raise ValueError("language and task are for a multilingual Whisper; this one is English-only "
                         "(generation_config.json's is_multilingual is false)")
    if language is not None and "lang_to_id" not in saved:
        raise ValueError("language needs generation_config.json's lang_to_id")
    if task is not None and (task not in TASKS or task not in (saved.get("task_to_id") or {})):
        raise ValueError(f"task={task!r}; valid: {', '.join(map(repr, TASKS))}, with generation_config.json's "
                         "task_to_id")
    if rows > 1 and not short and attention_mask is None:
        raise ValueError("several rows of long-form audio need attention_mask [batch, frames] (the feature "
                         "extractor's return_attention_mask=True): each row's audio ends where its mask does")
    if rows > 1 and not short and np.shape(attention_mask) != (rows, frames):
        raise ValueError(f"attention_mask has shape {np.shape(attention_mask)}; long-form audio reads one mask per "
                         f"frame, [{rows}, {frames}]")
    if short and frames < window:
        features = _padded(features, window)
    max_frames = (np.asarray(attention_mask).sum(-1).astype(np.int64) if rows > 1 and not short
                  else np.full(rows, frames, np.int64))
    prompts = prompt_tokens(model, features, saved, language, task, return_timestamps, rows)
    if prompt_ids is not None:
        prompt_ids = np.asarray(prompt_ids)
        if prompt_ids.ndim != 1:
            raise ValueError(f"prompt_ids has shape {prompt_ids.shape}; it is one list of ids ([<|startofprev|>, "
                             "text tokens...]) put before every row's prompt")
        checks.check_ids(prompt_ids[None], cfg.vocab_size, "prompt_ids")
        prompts = np.concatenate([np.repeat(prompt_ids[None], rows, 0), prompts], axis=1)
    _window_budget(cfg, prompts.shape[1], max_new_tokens, saved.get("max_length"))  # (refused before running)
    sample = temperature is not None and temperature > 0.0
    base = dict(num_beams=1 if sample else num_beams, do_sample=sample, temperature=temperature if sample else 1.0,
                top_k=top_k, top_p=top_p, length_penalty=length_penalty, early_stopping=early_stopping,
                suppress_tokens=_in_vocabulary(saved.get("suppress_tokens"), cfg.vocab_size),
                begin_suppress_tokens=_in_vocabulary(saved.get("begin_suppress_tokens"), cfg.vocab_size),
                no_timestamps_token_id=saved.get("no_timestamps_token_id") if return_timestamps else None,
                max_initial_timestamp_index=saved.get("max_initial_timestamp_index"))
    if assistant_model is not None:
        base.update(num_assistant_tokens=num_assistant_tokens or 5, assistant_shares_encoder=assistant_shares_encoder,
                    num_assistant_tokens_schedule=num_assistant_tokens_schedule or "constant",
                    draft_costs=() if draft_costs is None else tuple(map(float, draft_costs)))
    begin = (saved["no_timestamps_token_id"] + 1 if saved.get("no_timestamps_token_id") is not None
             else cfg.vocab_size + 1)  # (without the id, no token counts as a timestamp)
    max_length = saved.get("max_length")
    stride = window // cfg.audio.source_positions  # frames per encoder position
    seek = np.zeros(rows, np.int64)
    segments: list[list[dict[str, Any]]] = [[] for _ in range(rows)]
    key = jax.random.key(seed)
    while (seek < max_frames).any():
        active = np.flatnonzero(seek < max_frames)
        lengths = np.minimum(max_frames[active] - seek[active], window)
        windows = np.stack([_padded(features[i:i + 1, :, seek[i]:seek[i] + n], window)[0]
                            for i, n in zip(active, lengths)])
        prompt = prompts[active]
        new_tokens, max_length = _window_budget(cfg, prompt.shape[1], max_new_tokens, max_length)
        gc = generation.checkpoint_config(model, max_new_tokens=new_tokens, **base)
        key, sub = jax.random.split(key)
        generated = _generate_window(model, windows, prompt, sub, gc, assistant_model)
        for row, n, tokens in zip(active, lengths, generated):
            pieces, advance = window_segments(tokens, seek[row] * time_precision / stride, begin, int(n), stride,
                                              time_precision, time_precision_features)
            segments[row] += pieces
            seek[row] += advance
    joined = [np.concatenate([s["tokens"] for s in row]) if row else np.zeros(0, np.int64) for row in segments]
    width = max(len(t) for t in joined)
    pad = gc.pad_token_id
    sequences = np.stack([np.pad(t, (0, width - len(t)), constant_values=pad) for t in joined]).astype(np.int64)
    return {"sequences": sequences, "segments": segments} if return_segments else sequences


def _in_vocabulary(tokens, vocab: int) -> tuple[int, ...]:
    """A suppression list's ids the model has (transformers' mask passes over the others: tiny test files)."""
    return tuple(int(t) for t in tokens or () if 0 <= t < vocab)


def _window_budget(cfg: ModelConfig, prompt: int, max_new_tokens: int | None, max_length: int | None
                   ) -> tuple[int, int | None]:
    """A window's new tokens and the running max_length, as transformers' ``_set_max_new_tokens_and_length``: given
    max_new_tokens must fit the decoder's positions with the prompt; without it, generation_config.json's max_length
    grows by the prompt each window (up to the positions), else 20 new tokens (transformers' default)."""
    if max_new_tokens is not None:
        if max_new_tokens + prompt > cfg.max_positions:
            raise ValueError(f"the decoder prompt ({prompt} tokens) plus max_new_tokens={max_new_tokens} pass the "
                             f"{cfg.max_positions} decoder positions (max_target_positions): lower max_new_tokens to "
                             f"at most {cfg.max_positions - prompt}, or shorten prompt_ids")
        return max_new_tokens, max_length
    if max_length is None:
        return min(20, cfg.max_positions - prompt), None
    max_length = min(max_length + min(cfg.max_positions // 2 - 1, prompt), cfg.max_positions)
    if max_length <= prompt:
        raise ValueError(f"max_length={max_length} leaves no new tokens after the {prompt}-token decoder prompt")
    return max_length - prompt, max_length


def _generate_window(model, windows: np.ndarray, prompt: np.ndarray, key, gc: generation.GenerationConfig,
                     assistant=None) -> list[np.ndarray]:
    """One window per row: the compiled loop from each row's decoder ``prompt`` over its ``windows`` frames (drafted
    by ``assistant``, if given); per row the tokens generated, as transformers keeps them (the padding after the EOS
    cut, then the EOS)."""
    slots = prompt.shape[1] + gc.max_new_tokens + gc.draft_tokens
    generation.check_cache_memory(model.config, windows.shape[0] * gc.num_beams, slots, gc.draft_tokens)
    if assistant is not None:
        generation.check_cache_memory(assistant.config, windows.shape[0], slots, gc.draft_tokens)
    graphdef, state = nnx.split(model if assistant is None else (model, assistant))
    loop = generation.generate_tokens_jit if assistant is None else generation.drafted_tokens_jit
    tokens, steps, bad = loop(graphdef, state, None, None, key, config=gc,
                              decoder_input_ids=np.asarray(prompt, np.int32),
                              input_features=np.asarray(windows, np.float32))[:3]
    if int(bad) >= 0:
        raise ValueError(f"the model produced NaN or Inf logits at generation step {int(bad)}, so its tokens are "
                         "meaningless; check the weights for NaN/Inf")
    pad, eos = gc.pad_token_id, gc.eos_token_ids[0] if len(gc.eos_token_ids) == 1 else None
    kept = []
    for tokens_of_row in np.asarray(tokens)[:, :int(steps)].astype(np.int64):
        if tokens_of_row[-1] == pad:  # (transformers counts every pad id in the row, keeping one that is the EOS)
            padding = int(np.sum(tokens_of_row == pad)) - (pad == eos)
            tokens_of_row = tokens_of_row[:len(tokens_of_row) - padding]
        if len(tokens_of_row) and tokens_of_row[-1] == eos:
            tokens_of_row = tokens_of_row[:-1]
        kept.append(tokens_of_row)
    return kept


def window_segments(tokens: np.ndarray, time_offset: float, begin: int, window_frames: int, stride: int,
                    time_precision: float = TIME_PRECISION, time_precision_features: float = FRAME_SECONDS
                    ) -> tuple[list[dict[str, Any]], int]:
    """A window's segments and how many frames the next window starts after it, as transformers'
    ``_retrieve_segment``: the tokens are cut after each pair of timestamps (ids >= ``begin``); a segment runs from
    its first timestamp to its last (times from ``time_offset``, the window's start in seconds). Ending on a lone
    timestamp, or holding no pair, the window is done (``window_frames`` on); else what follows the last pair is
    dropped and the next window starts at that pair's time."""
    is_time = (tokens >= begin).tolist()
    lone_ending = is_time[-2:] == [False, True]
    cuts = [i + 1 for i in range(len(is_time) - 1) if is_time[i] and is_time[i + 1]]
    if not cuts:
        times = [i for i, flag in enumerate(is_time) if flag]
        end = int(window_frames * time_precision_features / time_precision)
        if times and tokens[times[-1]] != begin:
            end = float(tokens[times[-1]] - begin)
        return [dict(start=time_offset, end=time_offset + end * time_precision, tokens=tokens)], window_frames
    if lone_ending:
        cuts.append(len(tokens))
    else:
        cuts[-1] += 1  # the last pair's second timestamp closes its segment
    pieces, last = [], 0
    for i, cut in enumerate(cuts):
        piece = tokens[last:cut]
        end_at = -1 if i < len(cuts) - 1 or lone_ending else -2
        pieces.append(dict(start=time_offset + float(piece[0] - begin) * time_precision,
                           end=time_offset + float(piece[end_at] - begin) * time_precision, tokens=piece))
        last = cut
    if lone_ending:
        return pieces, window_frames
    return pieces, int(tokens[last - 2] - begin) * stride
