"""Tokenizers for the language study: a byte-level BPE trained on the training split, or GPT-2's own.

Both are byte-level (GPT-2's pre-tokenizer regex on bytes mapped to printable characters), so any text
encodes with no unknown token and `decode(encode(text)) == text`. `<|endoftext|>` is a special token: it
always encodes to one id (`eos_id`), the separator put between documents. A trained BPE is cached as
tokenizers' JSON under a name that hashes its training documents and settings, so a study trains it once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from maskjax import store
from maskjax.data.text import EOS, default_cache
from maskjax.errors import ConfigError, MissingFileError, OutputFolderError

FORMAT_VERSION = "maskjax-bpe-1"  # part of the cache key: bump when the training recipe changes
MIN_VOCAB = 257  # the 256 byte symbols and EOS


class TextTokenizer:
    """A thin wrapper that fixes the interface the study uses (ids as plain Python lists)."""

    def __init__(self, name: str, tokenizer: Tokenizer):
        eos_id = tokenizer.token_to_id(EOS)
        if eos_id is None:
            raise ConfigError(f"tokenizer {name} has no {EOS} token")
        self.name = name
        self.tokenizer = tokenizer
        self.eos_id: int = eos_id

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self.tokenizer.encode_batch(list(texts))]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"TextTokenizer({self.name!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


def _byte_level(model: models.Model) -> Tokenizer:
    """GPT-2's byte-level setup around a BPE model: no normaliser, no prefix space, so text round-trips."""
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _train_bpe(train_docs: Sequence[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE; the trainer is deterministic for a given document order."""
    tokenizer = _byte_level(models.BPE())
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(train_docs, trainer, length=len(train_docs))
    return tokenizer


def bpe_cache_key(train_docs: Sequence[str], vocab_size: int) -> str:
    """sha256 of the format version, the vocabulary size and every document (length-prefixed, in order)."""
    digest = hashlib.sha256(f"{FORMAT_VERSION}\n{vocab_size}\n{len(train_docs)}\n".encode())
    for document in train_docs:
        data = document.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def bpe(train_docs: Sequence[str], vocab_size: int, cache_dir: Path | None = None) -> TextTokenizer:
    """A byte-level BPE of at most `vocab_size` tokens trained on `train_docs`, cached in `cache_dir`
    (default `default_cache() / "tokenizers"`): a second call with the same documents and size loads it."""
    if isinstance(train_docs, str):
        raise ConfigError("bpe() takes a sequence of training documents, not one string")
    if vocab_size < MIN_VOCAB:
        raise ConfigError(f"BPE vocab_size {vocab_size} is below {MIN_VOCAB} (256 bytes and {EOS})")
    if not any(train_docs):
        raise ConfigError("no training text for the BPE tokenizer")
    directory = Path(cache_dir) if cache_dir is not None else default_cache() / "tokenizers"
    path = directory / f"bpe-{vocab_size}-{bpe_cache_key(train_docs, vocab_size)[:20]}.json"
    name = f"bpe-{vocab_size}"
    if path.is_file():
        return TextTokenizer(name, Tokenizer.from_file(str(path)))
    tokenizer = _train_bpe(train_docs, vocab_size)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        store.write_atomic(path, tokenizer.to_str())
    except OSError as error:
        raise OutputFolderError(f"cannot write the tokenizer cache in {path.parent}: {error.strerror}") from None
    return TextTokenizer(name, tokenizer)


def gpt2(directory: Path) -> TextTokenizer:
    """GPT-2's BPE (50,257 tokens) from its `vocab.json` and `merges.txt` in `directory`."""
    directory = Path(directory)
    vocab, merges = directory / "vocab.json", directory / "merges.txt"
    for path in (vocab, merges):
        if not path.is_file():
            raise MissingFileError(f"{path} not found (the gpt2 tokenizer reads vocab.json and merges.txt)")
    try:
        tokenizer = _byte_level(models.BPE.from_file(str(vocab), str(merges)))
    except Exception as error:  # tokenizers raises a bare Exception for malformed files
        raise ConfigError(f"cannot read the GPT-2 BPE in {directory}: {error}") from None
    if tokenizer.token_to_id(EOS) is None:
        raise ConfigError(f"{vocab} has no {EOS} token")
    tokenizer.add_special_tokens([AddedToken(EOS, special=True)])  # keeps its vocab id; matched before BPE
    return TextTokenizer("gpt2", tokenizer)


def get_tokenizer(
    spec: str, train_docs: Sequence[str], vocab_size: int, cache_dir: Path | None = None
) -> TextTokenizer:
    """`bpe` (trained on `train_docs`, `vocab_size` tokens) or `gpt2:DIR` (vocab_size is then GPT-2's own)."""
    if spec == "bpe":
        return bpe(train_docs, vocab_size, cache_dir)
    if spec.startswith("gpt2:") and spec[len("gpt2:") :]:
        return gpt2(Path(spec[len("gpt2:") :]).expanduser())
    raise ConfigError(f"unknown tokenizer {spec!r}; known: bpe, gpt2:DIR (a folder with vocab.json and merges.txt)")
