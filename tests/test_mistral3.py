"""Mistral 3's multimodal files (``mistral3``: Mistral Small 3.1 / 3.2 over a ``mistral`` text model, Mistral Small
4 over a ``mistral4`` one) as transformers computes them: each wrapper, saved by transformers with a tiny Pixtral
tower, loads its text model with a note, matches transformers' every layer and logits on text, and exports as its
text type, which transformers reads back to the same logits. Both tensor layouts read (the published one, which
transformers writes by default, and its modules' names), and both ways the head goes: untied as in every published
file (the wrapper ties by default, but a file holding its own head is not tied), tied as the class builds one. The
published config.json reads as its transformers-5 form; a text type jaxformer does not read is refused by name.
The text models themselves are tested in test_mistral4.py and through the mistral checkpoint of test_hf_parity.py."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxformer as jf  # noqa: E402
from jaxformer.compare import reference_model  # noqa: E402
from jaxformer.interop.hf import config_from_hf  # noqa: E402

from family_files import TINY, as_transformers_writes_it, matches_transformers, read  # noqa: E402
from test_mistral4 import PUBLISHED as MISTRAL4  # noqa: E402

VISION = dict(model_type="pixtral", hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
              head_dim=8, image_size=32, patch_size=4)
# mistralai/Mistral-Small-3.1-24B-Instruct-2503's config.json, every key kept (no tie_word_embeddings anywhere:
# the wrapper's class ties by default, the file holds its own head), sizes made tiny (the published: 40 layers of
# 5120, 32 heads of 128, 8 kv heads, 32768 wide, a 131072-token vocabulary; a 24-layer Pixtral tower)
PUBLISHED = {
    "architectures": ["Mistral3ForConditionalGeneration"], "image_token_index": 10, "model_type": "mistral3",
    "multimodal_projector_bias": False, "projector_hidden_act": "gelu", "spatial_merge_size": 2,
    "text_config": {"attention_dropout": 0.0, "head_dim": 8, "hidden_act": "silu", **TINY, "model_type": "mistral",
                    "rms_norm_eps": 1e-05, "rope_theta": 1000000000.0, "sliding_window": None, "use_cache": True},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"attention_dropout": 0.0, "head_dim": 8, "hidden_act": "gelu", "hidden_size": 16,
                      "image_size": 32, "intermediate_size": 32, "model_type": "pixtral", "num_attention_heads": 2,
                      "num_channels": 3, "num_hidden_layers": 1, "patch_size": 4, "rope_theta": 10000.0},
    "vision_feature_layer": -1}
NOTE = "tensors of the vision tower and its projector .* are not used by jaxformer"


@pytest.fixture(scope="module")
def wrappers(tmp_path_factory):
    """Two files saved by transformers: Small 3.1's shape, its head untied, in the published layout under the
    published config.json; Small 4's, its head tied, in the modules' layout (save_original_format=False)."""
    root = tmp_path_factory.mktemp("mistral3")
    text4 = {k: v for k, v in MISTRAL4.items() if k != "architectures"}
    out = {}
    for kind, text, tie, published_layout in (("mistral", PUBLISHED["text_config"], False, True),
                                              ("mistral4", text4, True, False)):
        config = transformers.Mistral3Config(text_config=copy.deepcopy(text), vision_config=VISION,
                                             tie_word_embeddings=tie)
        torch.manual_seed(0)
        model = transformers.Mistral3ForConditionalGeneration(config).eval()
        with torch.no_grad():  # weights of a trained model's scale, so that the layers' numbers differ visibly
            for p in model.parameters():
                p.normal_(0, 0.2) if p.ndim > 1 else p.uniform_(0.5, 1.5)
        model.save_pretrained(root / kind, save_original_format=published_layout)
        if kind == "mistral":
            (root / kind / "config.json").write_text(json.dumps(PUBLISHED))
        out[kind] = root / kind
    return out


@pytest.mark.parametrize("kind", ["mistral", "mistral4"])
def test_the_text_model_loads_with_a_note_matches_transformers_and_exports_as_its_type(kind, wrappers, tmp_path):
    folder = wrappers[kind]
    with pytest.warns(UserWarning, match=NOTE):
        model = jf.from_pretrained(folder, dtype="float32")  # (the published file says bfloat16)
    assert model.config.embeddings.tie == (kind == "mistral4")
    matches_transformers(folder)  # every layer and the logits, against transformers' load of the same folder
    ids = np.random.default_rng(1).integers(3, 97, (2, 11))
    with torch.no_grad():
        theirs = reference_model(folder)(input_ids=torch.as_tensor(ids)).logits.numpy()
    jf.save_pretrained(model, tmp_path / "text")
    written = json.loads((tmp_path / "text" / "config.json").read_text())
    expected = {"mistral": ("mistral", "MistralForCausalLM"), "mistral4": ("mistral4", "Mistral4ForCausalLM")}[kind]
    assert (written["model_type"], written["architectures"][0]) == expected
    again = reference_model(tmp_path / "text")  # (Mistral4ForCausalLM is no AutoModelForCausalLM)
    with torch.no_grad():
        np.testing.assert_allclose(again(input_ids=torch.as_tensor(ids)).logits.numpy(), theirs, atol=1e-5, rtol=0)


def test_the_published_file_reads_as_its_transformers_5_form():
    """Read without its tensors, a file ties as its wrapper says (true by default, and as written)."""
    cfg = read(PUBLISHED)
    assert read(as_transformers_writes_it(PUBLISHED)).replace(name=cfg.name) == cfg
    assert (cfg.attention, cfg.rotary.theta, cfg.head_dim_, cfg.embeddings.tie) == ("causal", 1e9, 8, True)
    # the text_config's tie_word_embeddings is never read by transformers (its text model has no head)
    text = {**PUBLISHED["text_config"], "tie_word_embeddings": True}
    assert read({**PUBLISHED, "text_config": text}) == cfg


def test_a_text_type_jaxformer_does_not_read_is_refused_by_name():
    text = {**PUBLISHED["text_config"], "model_type": "ministral3"}
    with pytest.raises(ValueError, match="mistral3: text_config model_type 'ministral3' is not read"):
        config_from_hf({**PUBLISHED, "text_config": text})


def test_a_wrapper_that_unties_a_file_without_a_head_is_refused_by_the_tensors_name(wrappers, tmp_path):
    """transformers would start that head from random numbers."""
    import shutil

    folder = tmp_path / "untied"
    shutil.copytree(wrappers["mistral4"], folder)
    hf = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**hf, "tie_word_embeddings": False}))
    with pytest.warns(UserWarning, match=NOTE), pytest.raises(ValueError, match="lm_head.weight"):
        jf.from_pretrained(folder)

