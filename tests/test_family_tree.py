"""The family tree's newer members train from their Hugging Face files: train.py starts from each tiny
checkpoint (``model.init_from=hf:``), a QLoRA fine-tune (int8 base, adapters on attention and MLP
projections, the MoEs with their balancing loss) whose loss falls. Parity, export and generation of each
are in test_hf_parity.py and test_generate.py."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

from jaxformer.train import run_config  # noqa: E402
from jaxformer.train.run import train  # noqa: E402

QLORA = ["train.steps=8", "train.batch_size=8", "train.seq_len=32", "train.log_every=2", "eval.every=8",
         "eval.batches=1", "optim.warmup_steps=1", "train.sample_tokens=0", "checkpoint.every=0", "optim.lr=2e-2",
         "finetune.lora.rank=4", "finetune.lora.targets=q,v,wi", "finetune.lora.base_dtype=int8",
         "model.overrides.vocab_size=227"]  # the bytes tokenizer's ids; the tiny files hold 97 rows


@pytest.mark.parametrize("name", ["openai-gpt", "gpt-neo", "gpt-neox", "gptj", "qwen3", "phi3", "glm4", "qwen3-moe",
                                  "qwen2-moe", "gpt-oss", "llama4", "deepseek-v32"])
def test_a_qlora_fine_tune_starts_from_the_file_and_its_loss_falls(name, checkpoints, tmp_path):
    cfg = run_config.load(None, QLORA + [f"model.init_from=hf:{checkpoints(name)}", f"run.dir={tmp_path}"])
    history = train(cfg, progress=False)["history"]
    losses = [r["loss"] for r in history]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.2, losses  # each falls by 0.4 or more here
    if "moe" in name or name in ("gpt-oss", "llama4"):  # (V3.2 balances by its selection bias, no loss)
        assert all(r["aux_loss"] > 0 for r in history)


def test_deepseek_v32_attends_to_the_keys_its_indexer_selects(checkpoints, tmp_path):
    """The tiny V3.2 keeps 4 keys per query of 9: it matches transformers (test_hf_parity), and the same weights
    with every key kept (index_topk past the length: V3's attention) give other logits, so the selection is what
    both implementations ran; and no gradient of the loss reaches the indexer."""
    import json
    import shutil

    import jax
    import jax.numpy as jnp
    from flax import nnx

    import jaxformer as jf
    from jaxformer.layers import IndexerParam

    sparse_path = checkpoints("deepseek-v32")
    dense_path = tmp_path / "dense"
    shutil.copytree(sparse_path, dense_path)
    hf = json.loads((dense_path / "config.json").read_text())
    (dense_path / "config.json").write_text(json.dumps({**hf, "index_topk": 64}))
    sparse, dense = jf.from_pretrained(sparse_path), jf.from_pretrained(dense_path)
    ids = np.random.default_rng(4).integers(3, 97, (2, 9))
    gap = np.abs(np.asarray(sparse(ids).logits) - np.asarray(dense(ids).logits))
    assert gap[:, :4].max() == 0.0 and gap[:, 4:].max() > 1e-3  # the first four queries see at most four keys

    def loss(model):
        return jnp.mean(model(jnp.asarray(ids)).logits ** 2)

    grads = nnx.grad(loss)(sparse)
    indexer = jax.tree.leaves(nnx.state(grads, IndexerParam))
    assert indexer and all(float(jnp.abs(g).max()) == 0.0 for g in indexer)


def test_a_multimodal_llama4_file_loads_its_text_model(tmp_path):
    """Scout and Maverick are published as Llama4ForConditionalGeneration: the text model loads (the vision
    tower skipped with a note), matches transformers' own load of the same file layer by layer, and is written
    back as a llama4_text file that transformers reloads with the same logits."""
    import json
    import warnings

    import torch
    import transformers

    import jaxformer as jf
    from jaxformer.compare import compare, format_table, reference_model

    from hf_factory import CHECKPOINTS

    text = {k: v for k, v in CHECKPOINTS["llama4"][2].items() if k != "attn_implementation"}
    vision = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=28,
                  patch_size=14, vision_output_dim=32, projector_input_dim=32, projector_output_dim=32)
    torch.manual_seed(0)
    transformers.Llama4ForConditionalGeneration(transformers.Llama4Config(text_config=text, vision_config=vision)
                                                ).save_pretrained(tmp_path / "multimodal")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = jf.from_pretrained(tmp_path / "multimodal")
    assert any("vision tower" in str(w.message) for w in caught)
    reference = transformers.Llama4ForConditionalGeneration.from_pretrained(
        tmp_path / "multimodal", dtype=torch.float32, attn_implementation="eager").eval()
    rng = np.random.default_rng(5)
    ids = rng.integers(3, 97, (2, 9))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    rows = compare(tmp_path / "multimodal", ids, mask, model=model, reference=reference.language_model)
    assert all(r.max_abs <= 1e-5 for r in rows), format_table(rows, 1e-5)

    jf.save_pretrained(model, tmp_path / "text")
    assert json.loads((tmp_path / "text" / "config.json").read_text())["model_type"] == "llama4_text"
    with torch.no_grad():
        theirs = reference_model(tmp_path / "text")(torch.as_tensor(ids)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(ids).logits), theirs, atol=1e-5, rtol=0)


def test_interleaved_expert_layers_are_one_computation_scanned_unrolled_or_rematerialised():
    """Maverick's periods of a dense and an expert layer: scanned by periods, unrolled layer by layer and under
    remat, the logits and the gradients agree (float32 rounding of a different program order)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import jaxformer as jf

    cfg = jf.config("tiny-mixtral").replace(decoder_layers=4, moe_layer_step=2, init_std=0.2)
    ids = jnp.asarray(np.random.default_rng(6).integers(0, cfg.vocab_size, (2, 7)))

    def run(**changes):
        model = jf.build(cfg.replace(**changes), seed=3)
        loss = lambda m: jnp.mean(m(ids).logits ** 2)  # noqa: E731
        value, grads = nnx.value_and_grad(loss)(model)
        return value, jax.tree.leaves(nnx.state(grads, nnx.Param))

    scanned = run()
    assert len(jf.build(cfg, seed=3).decoder.dense_blocks.attn_norm.scale.shape) == 2  # [2 dense layers, D]
    for other in (run(scan_layers=False), run(remat="full")):
        np.testing.assert_allclose(other[0], scanned[0], rtol=1e-6)
        for a, b in zip(other[1], scanned[1]):
            np.testing.assert_allclose(a, b, atol=1e-6 * max(1.0, float(jnp.abs(b).max())), rtol=0)


@pytest.mark.parametrize("name", ["mt5", "m2m100", "marian-separate", "pegasus"])
def test_a_translation_model_fine_tunes_seq2seq_from_its_file_with_qlora(name, checkpoints, tmp_path):
    """mT5, M2M-100 (fairseq's sinusoids counted from the pad id), Marian (its decoder's own token table) and
    Pegasus fine-tune with ``seq2seq`` on the shipped numbers-to-words pairs, int8 base and adapters on attention
    and MLP, from their tiny files."""
    cfg = run_config.load("configs/transformer_seq2seq.yaml", QLORA + [
        f"model.init_from=hf:{checkpoints(name)}", f"run.dir={tmp_path}", "train.seq_len=16", "model.overrides.vocab_size=360", "model.overrides.max_positions=64"])
    history = train(cfg, progress=False)["history"]
    losses = [r["loss"] for r in history if "loss" in r]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
