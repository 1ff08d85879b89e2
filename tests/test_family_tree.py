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
                                  "qwen2-moe", "gpt-oss"])
def test_a_qlora_fine_tune_starts_from_the_file_and_its_loss_falls(name, checkpoints, tmp_path):
    cfg = run_config.load(None, QLORA + [f"model.init_from=hf:{checkpoints(name)}", f"run.dir={tmp_path}"])
    history = train(cfg, progress=False)["history"]
    losses = [r["loss"] for r in history]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.2, losses  # each falls by 0.4 or more here
    if "moe" in name:
        assert all(r["aux_loss"] > 0 for r in history)
