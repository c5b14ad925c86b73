"""Language modelling as a task: documents packed into fixed windows, the relative-distance mask priors,
and the two scores (perplexity per token, bits per byte).

Packing: every split is one token stream, an end-of-text token before each document and after the
last, cut into non-overlapping windows of `context` predictions (window k holds stream tokens
k * context .. (k + 1) * context, inputs the first `context`, targets the last). Every stream token
after the first is therefore predicted exactly once, from at most `context` tokens of history; the
last window is padded and its padding weighted 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from maskjax.errors import ConfigError

MASK_INITS = ("window", "binary", "zero")


def window_widths(heads: int) -> np.ndarray:
    """w_h = 2, 4, 8, ...: each head's reach, so heads span local to long range."""
    return 2.0 ** np.arange(1, heads + 1)


def relative_mask_logits(heads: int, length: int, kind: str = "window") -> np.ndarray:
    """The initial m[h, d] [heads, length], one logit per head and distance d = i - j.

    "window": m = 1 - d / w_h, a soft window (at scale s = 10: log_sigmoid ~ 0 for d << w_h, -0.69 at
    d = w_h, about -10 (d / w_h - 1) beyond, an ALiBi-like linear tail); "binary": +1 for d < w_h,
    -1 beyond (at s = 10 the +-10 mask of the other studies); "zero": 0 everywhere (log 2 off every entry,
    the same attention as no mask)."""
    if kind not in MASK_INITS:
        raise ConfigError(f"unknown mask init {kind!r}; known: {', '.join(MASK_INITS)}")
    distance = np.arange(length, dtype=np.float64)[None, :]
    widths = window_widths(heads)[:, None]
    if kind == "window":
        return (1.0 - distance / widths).astype(np.float32)
    if kind == "binary":
        return np.where(distance < widths, 1.0, -1.0).astype(np.float32)
    return np.zeros((heads, length), np.float32)


def relative_profile(mask_HNN: np.ndarray) -> np.ndarray:
    """A full causal mask [..., N, N] read as a function of distance: the mean of M[i, i - d] over i,
    [..., N]; for a Toeplitz mask this is m itself."""
    n = mask_HNN.shape[-1]
    return np.stack([np.diagonal(mask_HNN, offset=-d, axis1=-2, axis2=-1).mean(-1) for d in range(n)], axis=-1)


def token_stream(documents: Sequence[Sequence[int]], eos_id: int) -> np.ndarray:
    """[eos, doc_0..., eos, doc_1..., eos, ...]: the split as one stream, every document closed by eos."""
    parts = [np.asarray([eos_id], np.int32)]
    for doc in documents:
        parts += [np.asarray(doc, np.int32), np.asarray([eos_id], np.int32)]
    return np.concatenate(parts)


def pack(stream: np.ndarray, context: int, keep_partial: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(windows [n, context + 1] int32, weights [n, context] float32) from a token stream; see the module
    docstring. keep_partial=False drops the last, short window (training)."""
    if context < 1:
        raise ConfigError(f"context must be >= 1, got {context}")
    predicted = len(stream) - 1
    if predicted < 1:
        raise ConfigError("a split needs at least one token to predict")
    full, rest = divmod(predicted, context)
    count = full + (1 if rest and keep_partial else 0)
    if count == 0:
        raise ConfigError(f"a split of {predicted} predicted tokens does not fill one window of {context}")
    padded = np.full(count * context + 1, stream[-1], np.int32)
    used = min(len(stream), len(padded))
    padded[:used] = stream[:used]
    index = np.arange(count)[:, None] * context + np.arange(context + 1)[None, :]
    weights = (index[:, 1:] <= predicted).astype(np.float32)
    return padded[index], weights


def split_bytes(documents: Sequence[str]) -> int:
    """The UTF-8 bytes a split's stream predicts: every document's bytes plus one per end-of-text token
    (the separator it stands for)."""
    return sum(len(doc.encode("utf-8")) + 1 for doc in documents)


def perplexity(nll_sum: float, tokens: float) -> float:
    """exp(mean negative log-likelihood per predicted token), token-weighted over the whole split."""
    return math.exp(nll_sum / tokens)


def bits_per_byte(nll_sum: float, n_bytes: int) -> float:
    """Total negative log-likelihood in bits over the split's UTF-8 bytes: no tokenizer can move it."""
    return nll_sum / math.log(2) / n_bytes


def unigram_logprobs(train: np.ndarray, vocab: int) -> np.ndarray:
    """log p(token) with add-one smoothing, [vocab]."""
    counts = np.bincount(train, minlength=vocab).astype(np.float64) + 1.0
    return np.log(counts / counts.sum())


def bigram_nll(train: np.ndarray, stream: np.ndarray, vocab: int, weight: float) -> float:
    """Summed negative log-likelihood of every token of `stream` after the first under a bigram model of
    `train` interpolated with its unigram: p(b | a) = weight * c(a, b) / c(a) + (1 - weight) * p(b)."""
    unigram = np.exp(unigram_logprobs(train, vocab))
    pairs, counts = np.unique(train[:-1].astype(np.int64) * vocab + train[1:], return_counts=True)
    context_counts = np.bincount(train[:-1], minlength=vocab).astype(np.float64)
    keys = stream[:-1].astype(np.int64) * vocab + stream[1:]
    at = np.clip(np.searchsorted(pairs, keys), 0, len(pairs) - 1)
    pair_counts = np.where(pairs[at] == keys, counts[at], 0).astype(np.float64)
    context = context_counts[stream[:-1]]
    conditional = np.divide(pair_counts, context, out=np.zeros_like(pair_counts), where=context > 0)
    mixed = np.where(context > 0, weight * conditional + (1 - weight) * unigram[stream[1:]], unigram[stream[1:]])
    return float(-np.log(mixed).sum())


def ngram_references(train: np.ndarray, validation: np.ndarray, test: np.ndarray, vocab: int) -> dict[str, float]:
    """The floors a language model should clear, as summed test NLL: add-one unigram, and the bigram
    interpolated with it at the weight (0.05 .. 0.95) that fits the validation stream best."""
    unigram = unigram_logprobs(train, vocab)
    weights = np.round(np.arange(0.05, 1.0, 0.05), 2)
    best = min(weights, key=lambda w: bigram_nll(train, validation, vocab, float(w)))
    return {
        "unigram": float(-unigram[test[1:]].sum()),
        "bigram": bigram_nll(train, test, vocab, float(best)),
        "bigram_weight": float(best),
    }
