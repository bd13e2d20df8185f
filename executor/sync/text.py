"""A small real language-modelling task for the synchronisation runs (``task = "text"``):
next-character prediction on the English prose CPython ships with its documentation
(``pydoc_data.topics``, the language reference's topics: about 465,000 characters on
Python 3.11, nothing to download), with a small causal transformer.

- The text: the topics in key order joined by blank lines, characters outside printable
  ASCII mapped to ``?``; the last 10% held out. Worker ``w`` of ``n`` trains on the
  ``w``-th contiguous ``1/n`` of the rest (each site its own part of the corpus) and
  samples windows of ``context + 1`` characters at random starts.
- The model: token and learned position embeddings, ``layers`` pre-norm blocks of causal
  self-attention (4 heads) and a 4x GELU MLP (``torch.nn.TransformerEncoderLayer``), a final
  norm and an output layer tied to the token embedding. ``hidden = (width, layers)``.
- The test: 256 fixed windows of the held-out text (the seed picks them); loss in nats
  per character and next-character accuracy.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["TextTask", "load_text", "CharTransformer", "CONTEXT", "TEXT_HIDDEN"]

CONTEXT = 64  # characters a window sees
TEXT_HIDDEN = (64, 2)  # width, layers
ALPHABET = sorted(set(string.printable) - set("\x0b\x0c\r"))


@dataclass
class TextTask:
    name: str
    train: torch.Tensor  # character ids
    test_x: torch.Tensor  # (windows, CONTEXT)
    test_y: torch.Tensor
    classes: int  # the alphabet
    context: int = CONTEXT

    def shard(self, worker: int, workers: int) -> tuple[torch.Tensor, None]:
        n = len(self.train)
        return self.train[n * worker // workers: n * (worker + 1) // workers], None

    def sample(self, data: tuple[torch.Tensor, None], batch: int, gen: torch.Generator
               ) -> tuple[torch.Tensor, torch.Tensor]:
        ids = data[0]
        starts = torch.randint(0, len(ids) - self.context - 1, (batch,), generator=gen)
        w = torch.stack([ids[s: s + self.context + 1] for s in starts.tolist()])
        return w[:, :-1], w[:, 1:]

    def evaluate(self, model: torch.nn.Module) -> tuple[float, float]:
        """(test loss in nats a character, next-character accuracy)."""
        with torch.no_grad():
            logits = model(self.test_x)
            loss = F.cross_entropy(logits.flatten(0, 1), self.test_y.flatten()).item()
            acc = (logits.argmax(-1) == self.test_y).float().mean().item()
        return loss, acc


def _corpus() -> str:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    keep = set(ALPHABET)
    return "".join(c if c in keep else "?" for c in text)


def load_text(seed: int = 0, windows: int = 256) -> TextTask:
    index = {c: i for i, c in enumerate(ALPHABET)}
    ids = torch.tensor([index[c] for c in _corpus()], dtype=torch.long)
    cut = int(len(ids) * 0.9)
    held = ids[cut:]
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(held) - CONTEXT - 1, (windows,), generator=gen).tolist()
    w = torch.stack([held[s: s + CONTEXT + 1] for s in starts])
    return TextTask("text", ids[:cut], w[:, :-1], w[:, 1:], len(ALPHABET))


class CharTransformer(torch.nn.Module):
    """A GPT-style causal character model (see the module docstring)."""

    def __init__(self, vocab: int, width: int, layers: int, context: int = CONTEXT) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Parameter(torch.zeros(context, width))
        block = torch.nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0,
                                                 activation="gelu", batch_first=True,
                                                 norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(width)
        torch.nn.init.normal_(self.embed.weight, std=0.02)  # GPT-2's; N(0, 1) tied logits
        torch.nn.init.normal_(self.position, std=0.02)  # start near 40 nats
        mask = torch.nn.Transformer.generate_square_subsequent_mask(context)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        h = self.embed(ids) + self.position[:t]
        mask: torch.Tensor = self.mask  # type: ignore[assignment]
        h = self.blocks(h, mask=mask[:t, :t], is_causal=True)
        return self.norm(h) @ self.embed.weight.T
