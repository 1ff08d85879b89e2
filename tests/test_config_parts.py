"""ModelConfig's sub-configs: a small top level, each optional part None where a model lacks it, the flat spelling
(presets, readers, overrides, run folders written before the parts) read into the same config."""

from __future__ import annotations

import dataclasses
import json

import pytest

import jaxformer as jf
from jaxformer.model_config import FLAT, GROUPS, NESTED, OPTIONAL_GROUPS, Experts, ModelConfig, Rotary


def test_the_top_level_is_small_and_every_flat_name_has_one_home():
    # 53 (50 before): the image front end (patches) and the joined image tower (vision) of issue 51's vision models,
    # the audio front end (audio) of issue 52's Whisper
    assert len(dataclasses.fields(ModelConfig)) <= 53
    top = {f.name for f in dataclasses.fields(ModelConfig)}
    assert set(GROUPS) <= top and not set(FLAT) & top
    for name, path in FLAT.items():  # each path names a real field of its part
        part = GROUPS[path[0]] if len(path) == 2 else NESTED[path[:2]]  # (the indexer, hyper-connections, ...)
        assert path[-1] in {f.name for f in dataclasses.fields(part)}, name
    assert all(getattr(ModelConfig(), group) is None for group in OPTIONAL_GROUPS)


@pytest.mark.parametrize("name", ["llama-3-8b", "deepseek-v3", "gemma-3-1b", "bert-base-uncased", "t5-small",
                                  "xlnet-base-cased", "mpnet-base", "deberta-v3-base", "gpt-oss-20b", "tiny-gpt"])
def test_a_preset_reads_alike_from_its_flat_spelling_and_its_nested_form(name):
    cfg = jf.config(name)
    assert ModelConfig.from_dict(cfg.to_flat()) == cfg
    assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert ModelConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}) == cfg


def test_an_absent_part_is_none_and_present_parts_say_what_the_model_has():
    llama, deepseek, bert = jf.config("tiny-llama"), jf.config("deepseek-v3"), jf.config("bert-base-uncased")
    assert llama.experts is None and llama.latent is None and llama.xl is None and isinstance(llama.rotary, Rotary)
    assert deepseek.experts.count == 256 and deepseek.latent.kv_rank == 512 and deepseek.latent.indexer is None
    assert bert.rotary is None and bert.head_options.pooler and bert.norms.position == "post"
    # the flat spelling as a change: a part appears, and goes
    moe = llama.replace(num_experts=4, experts_per_token=2)
    assert moe.experts == Experts(count=4, per_token=2)
    assert moe.replace(num_experts=0) == llama and moe.replace(experts=None) == llama
    assert llama.replace(norms=dataclasses.replace(llama.norms, eps=1e-6)) == llama.replace(norm_eps=1e-6)


@pytest.mark.parametrize("changes, fragments", [
    (dict(memory_len=4), ("memory_len=4", "position='xl'")),
    (dict(router_bias=True), ("router_bias=True", "num_experts > 0")),
    (dict(q_lora_rank=16), ("q_lora_rank=16", "kv_lora_rank")),
    (dict(index_heads=2), ("index_heads=2", "kv_lora_rank")),
    (dict(position="learned", rope_interleave=True), ("rope_interleave=True", "position='rope', not 'learned'")),
    (dict(qk_norm_span="projection"), ("qk_norm_span='projection'", "qk_norm=True")),
    (dict(parallel_shared_norm=True), ("parallel_shared_norm=True", "parallel_residual=True")),
    (dict(lora_targets=("q",)), ("lora_targets=('q',)", "lora_rank > 0")),
])
def test_a_setting_of_an_absent_part_is_refused_naming_what_it_needs(changes, fragments):
    with pytest.raises(ValueError) as err:
        jf.config("tiny-llama").replace(**changes)
    assert all(fragment in str(err.value) for fragment in fragments), str(err.value)


def test_settings_an_absent_part_leaves_without_effect_are_accepted_as_before():
    llama = jf.config("tiny-llama")
    assert llama.replace(router_aux_loss_coef=0.01, experts_per_token=4, moe_dispatch="dense") == llama
    with pytest.raises(ValueError, match="router_aux_loss_coef=-0.5 must be >= 0"):
        llama.replace(router_aux_loss_coef=-0.5)  # still a wrong value


def test_a_part_and_the_position_that_names_it_agree():
    with pytest.raises(ValueError, match="ModelConfig.rotary is set but position='learned', not 'rope'"):
        jf.config("tiny-gpt").replace(rotary=Rotary())
    assert jf.config("tiny-gpt").replace(position="rope").rotary == Rotary()  # named by position: its defaults
    with pytest.raises(ValueError, match="ModelConfig.norms is always present"):
        jf.config("tiny-gpt").replace(norms=None)
    with pytest.raises(ValueError, match="ModelConfig has no field"):
        jf.config("tiny-gpt").replace(experts_count=3)


def _losses(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_a_run_folder_written_before_the_sub_configs_resumes_as_it_trained(tmp_path):
    """Its model.json holds the flat spelling (every setting at the top level); resuming from it is no change
    of the model, and the losses are those of a run never interrupted."""
    from jaxformer.train.run import main

    common = ["model.preset=tiny-llama", "train.batch_size=4", "train.seq_len=32", "train.log_every=5",
              "train.sample_tokens=0", "eval.every=50", "eval.batches=1", "optim.warmup_steps=2", "optim.schedule=constant",
              "checkpoint.every=10"]
    clean, old = tmp_path / "clean", tmp_path / "old"
    main(common + ["train.steps=20", f"run.dir={clean}"])
    main(common + ["train.steps=10", f"run.dir={old}"])
    stored = json.loads((old / "model.json").read_text())
    assert "rotary" in stored and "rope_theta" not in stored  # written nested now
    flat = {key: dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
            for key, value in ModelConfig.from_dict(stored).to_flat().items() if key != "qk_norm_span"}
    (old / "model.json").write_text(json.dumps(flat, indent=1) + "\n")  # as the flat ModelConfig wrote it
    main(common + ["train.steps=20", f"run.dir={old}", "train.resume=force"])  # (force: only the steps change)
    records = [json.loads(line) for line in (old / "metrics.jsonl").read_text().splitlines()]
    assert [r["resumed_with_changes"] for r in records if "resumed_with_changes" in r] == [["train.steps: 10 -> 20"]]
    assert _losses(old) == _losses(clean)


def test_a_jaxformer_checkpoint_written_before_the_sub_configs_loads(tmp_path):
    """Its meta file holds the config in the flat spelling; the weights restore into the same model."""
    import numpy as np
    from flax import nnx

    from jaxformer.checkpoint import CONFIG_FILE, load_model, save_model

    model = jf.build("tiny-deepseek", seed=0)  # latent attention, experts, rotary scaling: parts in play
    save_model(model, tmp_path)
    meta = json.loads((tmp_path / CONFIG_FILE).read_text())
    flat = {key: dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
            for key, value in model.config.to_flat().items() if key != "qk_norm_span"}
    (tmp_path / CONFIG_FILE).write_text(json.dumps({**meta, "config": flat}))
    loaded = load_model(tmp_path)
    assert loaded.config == model.config
    ids = np.arange(1, 9)[None]
    np.testing.assert_array_equal(np.asarray(loaded(ids).logits), np.asarray(model(ids).logits))
    paths = lambda m: [path for path, _ in nnx.to_flat_state(nnx.state(m))]  # noqa: E731
    assert paths(loaded) == paths(model)
