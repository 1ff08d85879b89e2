"""The 2017 Transformer against torch.nn.Transformer: same weights, same outputs, both layouts."""

from __future__ import annotations

import numpy as np
import pytest

import jax.numpy as jnp

torch = pytest.importorskip("torch")

from jaxformer.interop import nn_transformer  # noqa: E402
from jaxformer.layers import sinusoids  # noqa: E402


def _embed(model, ids):
    """What jaxformer feeds its stacks: table[ids] * sqrt(D) + sinusoids; torch gets the same input."""
    d = model.config.d_model
    table = np.asarray(model.embed.table[...])
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    return torch.tensor(table[ids] * np.sqrt(d) + np.asarray(sinusoids(positions, d)), dtype=torch.float32)


@pytest.mark.parametrize("batch_first", [True, False])
def test_outputs_match_torch(batch_first):
    torch.manual_seed(0)
    reference = torch.nn.Transformer(d_model=32, nhead=4, num_encoder_layers=2, num_decoder_layers=3,
                                     dim_feedforward=48, dropout=0.0, batch_first=batch_first).eval()
    cfg = nn_transformer.config_for(32, 4, 2, 3, 48, vocab_size=50, max_positions=64)
    model = nn_transformer.from_state_dict(reference.state_dict(), cfg)
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(0, 50, (2, 7)), rng.integers(0, 50, (2, 5))
    src_mask = np.ones_like(src)
    src_mask[1, 4:] = 0
    ours = np.asarray(model(src, src_mask, decoder_input_ids=tgt).last_hidden_state)
    s, t = _embed(model, src), _embed(model, tgt)
    if not batch_first:
        s, t = s.transpose(0, 1), t.transpose(0, 1)
    padding = torch.tensor(src_mask == 0)
    with torch.no_grad():
        ref = reference(s, t, tgt_mask=reference.generate_square_subsequent_mask(5), src_key_padding_mask=padding,
                        memory_key_padding_mask=padding)
    ref = (ref if batch_first else ref.transpose(0, 1)).numpy()
    assert np.abs(ref - ours).max() <= 1e-5


def test_state_dict_round_trip_is_exact():
    reference = torch.nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                     dim_feedforward=24, dropout=0.0)
    cfg = nn_transformer.config_for(16, 2, 1, 1, 24, vocab_size=11)
    back = nn_transformer.to_state_dict(nn_transformer.from_state_dict(reference.state_dict(), cfg))
    state = reference.state_dict()
    assert set(back) == set(state)
    for name, tensor in state.items():
        np.testing.assert_array_equal(back[name], tensor.numpy(), err_msg=name)
    reference.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()})


def test_mismatched_state_dict_is_refused():
    reference = torch.nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                     dim_feedforward=24)
    cfg = nn_transformer.config_for(16, 2, 2, 1, 24, vocab_size=11)  # two encoder layers expected
    with pytest.raises(ValueError, match=r"missing tensors.*encoder\.layers\.1"):
        nn_transformer.from_state_dict(reference.state_dict(), cfg)
