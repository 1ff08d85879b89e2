"""A LLaVA-shaped pair on CPU: jaxformer against transformers' LlavaForConditionalGeneration, float32, one run.

A small LLaVA (random weights, saved once in the Hugging Face format and loaded by both): a CLIP tower of 6 layers
x 384 over 224-pixel images in 16-pixel patches (196 image tokens a picture, the class token dropped as LLaVA-1.5
does), the two-layer projector, and a LLaMA decoder of 8 layers x 512 (vocabulary 32,000). Two workloads,
the sides alternating call by call so they see the same machine load; rates from the median time:

- forward: batch 4, each row one image and 32 text tokens (228 tokens), the image read by the tower, projected and
  placed, then the decoder and the logits: jaxformer's jitted forward (compiled before timing) against transformers'
  eager model under ``torch.inference_mode`` (its default attention, SDPA);
- decode: batch 1, one image in a prompt of 196 + 16 tokens, 64 new tokens greedy (no EOS: every run writes all
  of them): ``model.generate`` (compiled on the first call, which is not timed) against transformers' ``generate``;
  tokens/s of new tokens, prefill included, and whether the tokens are equal.

    python benchmarks/vision.py [--repeats 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from pathlib import Path

from side_by_side import interleaved  # (this folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    import jax
    import numpy as np
    import torch
    import transformers

    import jaxformer as jf

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    tower = transformers.CLIPVisionConfig(hidden_size=384, intermediate_size=1536, num_hidden_layers=6,
                                          num_attention_heads=6, image_size=224, patch_size=16)
    text = transformers.LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                                    num_attention_heads=8, num_key_value_heads=8, vocab_size=32000,
                                    bos_token_id=None, eos_token_id=None, pad_token_id=0)
    config = transformers.LlavaConfig(vision_config=tower, text_config=text, image_token_index=31999,
                                      vision_feature_layer=-2, vision_feature_select_strategy="default")
    folder = Path(tempfile.mkdtemp(prefix="jaxformer-vision-"))
    transformers.LlavaForConditionalGeneration(config).save_pretrained(folder)
    reference = transformers.LlavaForConditionalGeneration.from_pretrained(folder).eval()
    model = jf.from_pretrained(folder)
    per_image = (224 // 16) ** 2
    rng = np.random.default_rng(0)

    def prompt(rows: int, text_tokens: int):
        ids = rng.integers(1, 31999, (rows, per_image + text_tokens))
        ids[:, 1:1 + per_image] = 31999  # after a first text token, as "USER: <image>..." places it
        return ids, rng.standard_normal((rows, 3, 224, 224)).astype(np.float32)

    result = {}
    ids, pixels = prompt(4, 32)
    mask = np.ones_like(ids)
    graphdef, state = jf.split(model)

    @jax.jit
    def forward_jit(state, ids, mask, pixels):
        return jf.merge(graphdef, state)(ids, mask, pixel_values=pixels).logits

    def forward(ids, mask, pixels):
        return forward_jit(state, ids, mask, pixels)
    torch_ids, torch_mask, torch_pixels = (torch.as_tensor(x) for x in (ids, mask, pixels))

    def run_torch():
        with torch.inference_mode():
            return reference(input_ids=torch_ids, attention_mask=torch_mask, pixel_values=torch_pixels).logits

    _, seconds, _ = interleaved({"jaxformer": lambda: forward(ids, mask, pixels).block_until_ready(),
                                 "transformers": run_torch}, args.repeats)
    difference = float(np.abs(np.asarray(forward(ids, mask, pixels)) - run_torch().numpy()).max())
    tokens = ids.size
    result.update(forward_tokens_s=round(tokens / seconds["jaxformer"], 1),
                  forward_hf_tokens_s=round(tokens / seconds["transformers"], 1),
                  forward_ratio=round(seconds["transformers"] / seconds["jaxformer"], 3),
                  forward_logits_max_abs=difference)

    ids, pixels = prompt(1, 16)
    mask = np.ones_like(ids)
    new = args.new_tokens
    torch_ids, torch_mask, torch_pixels = (torch.as_tensor(x) for x in (ids, mask, pixels))

    def decode_ours():
        return np.asarray(model.generate(ids, attention_mask=mask, pixel_values=pixels, max_new_tokens=new))

    def decode_theirs():
        with torch.inference_mode():
            return reference.generate(input_ids=torch_ids, attention_mask=torch_mask, pixel_values=torch_pixels,
                                      max_new_tokens=new, do_sample=False, pad_token_id=0).numpy()

    outputs, seconds, _ = interleaved({"jaxformer": decode_ours, "transformers": decode_theirs},
                                      max(3, args.repeats // 3))
    ours, theirs = outputs["jaxformer"], outputs["transformers"]
    result.update(decode_tokens_s=round(new / seconds["jaxformer"], 1),
                  decode_hf_tokens_s=round(new / seconds["transformers"], 1),
                  decode_ratio=round(seconds["transformers"] / seconds["jaxformer"], 3),
                  decode_tokens_identical=bool(ours.shape == theirs.shape and (ours == theirs).all()))
    if args.json:
        print(json.dumps(result))
        return
    print(f"LLaVA-shaped pair (CLIP tower 6 x 384, 196 image tokens; LLaMA 8 x 512), float32, median of "
          f"{args.repeats}")
    print(f"forward, batch 4 x {tokens // 4} tokens: jaxformer {result['forward_tokens_s']:.0f} tokens/s, "
          f"transformers {result['forward_hf_tokens_s']:.0f} -> {result['forward_ratio']:.2f}x "
          f"(logits max abs {difference:.1e})")
    print(f"decode, one image, {new} new tokens greedy: jaxformer {result['decode_tokens_s']:.1f} tokens/s, "
          f"transformers {result['decode_hf_tokens_s']:.1f} -> {result['decode_ratio']:.2f}x; tokens identical: "
          f"{result['decode_tokens_identical']}")


if __name__ == "__main__":
    main()
