"""Text corpora for the small-language-model study, as plain-text documents split into train / validation / test.

Every loader returns `TextCorpus`: tuples of documents (plain text, paragraphs one per line). Splits are
made per document, never inside one, so no validation or test text is seen in training.

- `brown`: the Brown corpus (500 POS-tagged files), read from the folder `scripts/fetch_brown.py` fills
  (`default_cache() / "brown"`). Tags are stripped and the tokens joined back into ordinary text.
- `tinystories`, `wikitext2`: from their local files in `data_dir`, or, with no `data_dir`, through
  Hugging Face `datasets` (the `[language]` extra; that route downloads on its first call).
- `text`: any UTF-8 text: a .txt file of documents or a folder of .txt files, one document each.

`brown` and `text` have no official splits; both use `split_by_index` on the documents in a fixed order
(file names sorted, or their order in one file): index % 10 == 9 is test, index % 10 == 8 validation, the
rest train (80 / 10 / 10). The Brown files sort by genre (ca01..ca44 press, ..., cr01..cr09 humour), so
every genre lands in all three splits in its own proportion. TinyStories has no test split: its validation
file is the test split and every 100th training story is held out as validation. WikiText-2 keeps its own
three splits, cut into articles at top-level headings.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from maskjax.errors import ConfigError, MissingFileError

CORPORA = ("brown", "tinystories", "wikitext2", "text")
SPLITS = ("train", "validation", "test")
EOS = "<|endoftext|>"  # TinyStories' story separator, and the `text` corpus's document separator
BROWN_FILE = re.compile(r"c[a-r]\d\d")
WIKITEXT_FILES = {"train": "wiki.train.raw", "validation": "wiki.valid.raw", "test": "wiki.test.raw"}
TINYSTORIES_FILES = {"train": "TinyStories-train.txt", "validation": "TinyStories-valid.txt"}
# Hub repositories (and config) of the `datasets` route. Tests point these at local folders laid out like
# the hub repos (README.md with `configs:` and the parquet files), read by the real `datasets` library.
HF_SOURCES = {
    "wikitext2": ("Salesforce/wikitext", "wikitext-2-raw-v1"),
    "tinystories": ("roneneldan/TinyStories", None),
}
LANGUAGE_EXTRA = 'the `datasets` library is not installed: `pip install -e ".[language]"`, or pass --data-dir'


@dataclasses.dataclass(frozen=True)
class TextCorpus:
    name: str
    train: tuple[str, ...]
    validation: tuple[str, ...]
    test: tuple[str, ...]

    def splits(self) -> dict[str, tuple[str, ...]]:
        """The three splits by name, in the order train, validation, test."""
        return {split: getattr(self, split) for split in SPLITS}

    def sizes(self) -> dict[str, tuple[int, int]]:
        """(documents, characters) per split, for logs and records."""
        return {split: (len(docs), sum(map(len, docs))) for split, docs in self.splits().items()}


def default_cache() -> Path:
    """Where fetched corpora and trained tokenizers live: `$MASKJAX_CACHE`, else ~/.cache/maskjax."""
    return Path(os.environ.get("MASKJAX_CACHE") or Path.home() / ".cache" / "maskjax")


def split_by_index(documents: Sequence[str], name: str) -> TextCorpus:
    """The fixed rule for corpora without official splits: index % 10 == 9 test, == 8 validation, rest train.

    Deterministic and seed-free, so every run and every machine sees the same split. With 3 to 9
    documents (the rule would leave a split empty) the last two are validation and test, which is the
    same rule's answer at 10.
    """
    if len(documents) < 3:
        raise ConfigError(f"the {name} corpus has {len(documents)} document(s); splitting it needs at least 3")
    if len(documents) < 10:
        return TextCorpus(name, tuple(documents[:-2]), (documents[-2],), (documents[-1],))
    return TextCorpus(
        name,
        tuple(doc for index, doc in enumerate(documents) if index % 10 < 8),
        tuple(doc for index, doc in enumerate(documents) if index % 10 == 8),
        tuple(doc for index, doc in enumerate(documents) if index % 10 == 9),
    )


# --- Brown ---

OPENERS = {"(", "[", "`", "``"}
CLOSERS = {".", ",", ";", ":", "!", "?", "'", "''", ")", "]"}
QUOTES = {"``": '"', "''": '"'}


def detokenize(tokens: Sequence[str]) -> str:
    """Brown tokens joined by spaces, with none before closing punctuation or after an opening bracket.

    `` and '' (the corpus's opening and closing double quotes) both become ", attached to the quoted text.
    """
    out: list[str] = []
    for i, token in enumerate(tokens):
        if i and token not in CLOSERS and tokens[i - 1] not in OPENERS:
            out.append(" ")
        out.append(QUOTES.get(token, token))
    return "".join(out)


def brown_document(tagged: str) -> str:
    """One Brown file as plain text: tags stripped (after the last '/' of each token), one paragraph per line.

    In the files a paragraph is a block of lines (one sentence each, most starting with a tab) and blocks
    are separated by blank lines.
    """
    paragraphs = []
    for block in re.split(r"\n\s*\n", tagged):
        tokens = [token.rsplit("/", 1)[0] if "/" in token else token for token in block.split()]
        if tokens:
            paragraphs.append(detokenize(tokens))
    return "\n".join(paragraphs)


def load_brown(data_dir: Path | None = None) -> TextCorpus:
    """The 500 Brown documents from `data_dir` (default `default_cache() / "brown"`), split by `split_by_index`."""
    directory = Path(data_dir) if data_dir is not None else default_cache() / "brown"
    files = sorted(p for p in directory.iterdir() if BROWN_FILE.fullmatch(p.name)) if directory.is_dir() else []
    if not files:
        raise MissingFileError(
            f"no Brown corpus files (ca01 ... cr09) in {directory}: run `python scripts/fetch_brown.py"
            + (f" --cache {directory}`" if data_dir is not None else "`")
        )
    return split_by_index([brown_document(_read_text(p)) for p in files], "brown")


# --- WikiText-2 ---


def is_wikitext_title(line: str) -> bool:
    """A top-level WikiText heading (` = Title = `); section headings (` = = Section = = `) are not."""
    s = line.strip()
    return len(s) > 4 and s.startswith("= ") and s.endswith(" =") and not s.startswith("= =")


def wikitext_documents(lines: Iterable[str]) -> list[str]:
    """WikiText lines grouped into articles: a new document starts at each top-level heading.

    Lines are stripped and blank ones dropped, so a document is its title line, its section headings and
    its paragraphs, one per line (the raw files' tokenisation, ` @-@ ` and all, is kept as it is). Lines
    before the first heading, if any, form a document of their own. The same function reads the local
    .raw files (their lines) and the Hugging Face rows (one line each).
    """
    documents: list[str] = []
    current: list[str] = []
    for line in lines:
        if is_wikitext_title(line) and current:
            documents.append("\n".join(current))
            current = []
        if line.strip():
            current.append(line.strip())
    if current:
        documents.append("\n".join(current))
    return documents


def load_wikitext2(data_dir: Path | None = None) -> TextCorpus:
    """WikiText-2 (raw) by article: from wiki.{train,valid,test}.raw in `data_dir`, else from Hugging Face."""
    if data_dir is not None:
        directory = _folder(data_dir, "wikitext2", "wiki.train.raw, wiki.valid.raw and wiki.test.raw")
        lines = {split: _read_text(directory / file).splitlines() for split, file in WIKITEXT_FILES.items()}
    else:
        dataset = _hf_dataset("wikitext2")
        lines = {split: dataset[split]["text"] for split in SPLITS}
    return TextCorpus("wikitext2", *(tuple(wikitext_documents(lines[split])) for split in SPLITS))


# --- TinyStories ---


def stories(chunks: Iterable[str]) -> Iterator[str]:
    """Stories from a stream of text pieces in which stories are separated by <|endoftext|>.

    Pieces may be lines of the .txt files or whole stories with a separator appended (the Hugging Face
    rows); each story is stripped and empty ones are dropped.
    """
    pending: list[str] = []
    for chunk in chunks:
        *ended, rest = chunk.split(EOS)
        for piece in ended:
            pending.append(piece)
            if story := "".join(pending).strip():
                yield story
            pending = []
        pending.append(rest)
    if story := "".join(pending).strip():
        yield story


def tinystories_splits(train: Iterable[str], valid: Iterable[str], name: str = "tinystories") -> TextCorpus:
    """TinyStories has no test split: its validation file stands for test, and every 100th training story
    (index % 100 == 99, 1%) is held out as validation (empty below 100 stories)."""
    kept, held_out = [], []
    for index, story in enumerate(train):
        (held_out if index % 100 == 99 else kept).append(story)
    return TextCorpus(name, tuple(kept), tuple(held_out), tuple(valid))


def load_tinystories(data_dir: Path | None = None) -> TextCorpus:
    """TinyStories from TinyStories-{train,valid}.txt in `data_dir`, else from Hugging Face.

    Splits as `tinystories_splits` says."""
    if data_dir is not None:
        directory = _folder(data_dir, "tinystories", "TinyStories-train.txt and TinyStories-valid.txt")
        paths = {split: directory / file for split, file in TINYSTORIES_FILES.items()}
        for path in paths.values():
            if not path.is_file():
                raise MissingFileError(
                    f"{path} not found (the tinystories corpus reads {' and '.join(TINYSTORIES_FILES.values())})"
                )
        try:
            with open(paths["train"], encoding="utf-8") as train, open(paths["validation"], encoding="utf-8") as valid:
                return tinystories_splits(stories(train), stories(valid))
        except UnicodeDecodeError as error:
            raise ConfigError(f"a TinyStories file in {directory} is not UTF-8 text ({error.reason})") from None
    dataset = _hf_dataset("tinystories")
    rows = {split: (text + EOS for text in dataset[split]["text"]) for split in ("train", "validation")}
    return tinystories_splits(stories(rows["train"]), stories(rows["validation"]))


# --- any text ---


def text_documents(text: str) -> list[str]:
    """Documents in one text: separated by lines holding only <|endoftext|>, or, when there is no such line,
    each block of non-blank lines is a document."""
    lines = text.splitlines()
    if any(line.strip() == EOS for line in lines):
        blocks, current = [], []
        for line in lines:
            if line.strip() == EOS:
                blocks.append(current)
                current = []
            else:
                current.append(line)
        blocks.append(current)
        documents = ["\n".join(block).strip() for block in blocks]
    else:
        documents = [block.strip() for block in re.split(r"\n[ \t]*\n", "\n".join(lines))]
    return [document for document in documents if document]


def load_text(path: Path | None) -> TextCorpus:
    """A .txt file of documents (`text_documents`) or a folder of .txt files (each non-empty file one
    document, in name order), split by `split_by_index`."""
    if path is None:
        raise ConfigError("the text corpus needs --data-dir: a .txt file of documents or a folder of .txt files")
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.txt"))
        if not files:
            raise MissingFileError(f"no .txt files in {path}")
        documents = [doc for doc in (_read_text(file).strip() for file in files) if doc]
    elif path.is_file():
        documents = text_documents(_read_text(path))
    else:
        raise MissingFileError(f"{path} not found (the text corpus reads a .txt file or a folder of .txt files)")
    if not documents:
        raise ConfigError(f"{path} holds no text")
    return split_by_index(documents, "text")


# --- entry point and helpers ---


def load_corpus(name: str, data_dir: Path | None = None) -> TextCorpus:
    """The corpus `name` (one of CORPORA) as train / validation / test documents; `data_dir` as each loader says."""
    loaders = {"brown": load_brown, "tinystories": load_tinystories, "wikitext2": load_wikitext2, "text": load_text}
    if name not in loaders:
        raise ConfigError(f"unknown corpus {name!r}; known: {', '.join(CORPORA)}")
    return loaders[name](Path(data_dir) if data_dir is not None else None)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingFileError(f"{path} not found") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path} is not UTF-8 text ({error.reason} at byte {error.start})") from None


def _folder(data_dir: Path, name: str, holds: str) -> Path:
    directory = Path(data_dir)
    if not directory.is_dir():
        raise MissingFileError(f"no folder {directory} (the {name} corpus reads {holds} from --data-dir)")
    return directory


def _hf_dataset(corpus: str):
    """`datasets.load_dataset` on HF_SOURCES[corpus], imported only here: the library is an optional extra."""
    try:
        import datasets
    except ImportError:
        raise ConfigError(LANGUAGE_EXTRA) from None
    repo, config = HF_SOURCES[corpus]
    return datasets.load_dataset(repo, config)
