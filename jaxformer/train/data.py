"""Text for causal-LM training, with nothing downloaded: bytes of a corpus as token ids (vocabulary
256), cut into fixed-length windows chosen by (seed, step) alone, so the batch of any step can be
recomputed exactly (a resumed run sees the batches an uninterrupted one would have seen)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

BYTE_VOCAB = 256


def default_corpus() -> str:
    """English prose and code shipped with every Python install: the pydoc topics (about 460 KB)."""
    from pydoc_data import topics

    return "\n\n".join(topics.topics[name] for name in sorted(topics.topics))


def load_corpus(name: str) -> np.ndarray:
    text = default_corpus() if name == "python-docs" else None
    if text is None:
        path = Path(name)
        if not path.is_file():
            raise ValueError(f"data.corpus={name!r} is neither 'python-docs' nor a readable text file")
        text = path.read_text(encoding="utf-8")
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)


class ByteWindows:
    """Train and held-out splits of one corpus; ``batch(step)`` is a pure function of the step."""

    def __init__(self, tokens: np.ndarray, seq_len: int, eval_fraction: float, seed: int):
        split = int(len(tokens) * (1 - eval_fraction))
        self.train, self.held_out = tokens[:split], tokens[split:]
        self.seq_len, self.seed = seq_len, seed
        for name, part in (("training", self.train), ("held-out", self.held_out)):
            if len(part) <= seq_len + 1:
                raise ValueError(f"the {name} split has {len(part)} tokens, too few for train.seq_len={seq_len}")

    def _windows(self, source: np.ndarray, starts: np.ndarray) -> np.ndarray:
        return np.stack([source[s:s + self.seq_len + 1] for s in starts])  # inputs and shifted targets

    def batch(self, step: int, batch_size: int) -> np.ndarray:
        rng = np.random.default_rng((self.seed, step))
        return self._windows(self.train, rng.integers(0, len(self.train) - self.seq_len - 1, batch_size))

    def eval_batches(self, count: int, batch_size: int) -> list[np.ndarray]:
        """Fixed, evenly spaced held-out windows: the same every time they are evaluated."""
        total = count * batch_size
        starts = np.linspace(0, len(self.held_out) - self.seq_len - 1, total).astype(int)
        return [self._windows(self.held_out, starts[i * batch_size:(i + 1) * batch_size]) for i in range(count)]


def decode_bytes(ids) -> str:
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
