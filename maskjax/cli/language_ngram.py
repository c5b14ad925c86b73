"""The floors a small LM should clear: python -m experiments.language_ngram --corpus=brown

Unigram (add-one) and interpolated bigram models counted on the training split's tokens (the same BPE
and packing stream as `experiments.language`), the bigram's weight chosen on the validation split,
scored on every test token the language study scores. Prints perplexity per token and bits per byte;
with --out writes results.jsonl (with config, commit, JAX version and devices) and summary.md there.
"""

from __future__ import annotations

import sys
from pathlib import Path

from maskjax import store
from maskjax.cli.driver import Parser, positive_int, progress, run_main
from maskjax.data import text, tokenizer
from maskjax.studies import language as study
from maskjax.tasks import language as lt


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m experiments.language_ngram", description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default="brown", choices=text.CORPORA, help="default brown")
    p.add_argument("--data-dir", type=Path, help="the corpus's files (see experiments.language)")
    p.add_argument("--preset", default="quick", help="the language preset whose tokenizer to use (default quick)")
    p.add_argument("--tokenizer", help="bpe or gpt2:DIR (default: the preset's)")
    p.add_argument("--vocab-size", type=positive_int, help="BPE vocabulary size (default: the preset's)")
    p.add_argument("--cache", type=Path, help="tokenizer cache folder")
    p.add_argument("--out", type=Path, help="folder for results.jsonl and summary.md (default: print only)")
    args = p.parse_args(argv)
    config = study.STUDY.preset(args.preset)
    spec, vocab = args.tokenizer or config.tokenizer, args.vocab_size or config.vocab_size
    if args.out is not None:
        store.ensure_writable_dir(args.out)
    corpus = text.load_corpus(args.corpus, args.data_dir)
    tok = tokenizer.get_tokenizer(spec, corpus.train, vocab, args.cache)
    streams = {
        name: lt.token_stream(tok.encode_batch(list(getattr(corpus, name))), tok.eos_id)
        for name in ("train", "validation", "test")
    }
    progress(f"counting {len(streams['train'])} training tokens")
    nll = lt.ngram_references(streams["train"], streams["validation"], streams["test"], tok.vocab_size)
    tokens, n_bytes = len(streams["test"]) - 1, lt.split_bytes(corpus.test)
    config_record = {
        "study": "language_ngram",
        "corpus": args.corpus,
        "tokenizer": tok.name,
        "bigram_weight": nll["bigram_weight"],
    }
    rows = ["| corpus | model | test_ppl | test_bpb |", "|---|---|---|---|"]
    records = []
    for model in ("unigram", "bigram"):
        ppl, bpb = lt.perplexity(nll[model], tokens), lt.bits_per_byte(nll[model], n_bytes)
        records.append(
            {
                "corpus": args.corpus,
                "method": model,
                "tokenizer": tok.name,
                "test_ppl": ppl,
                "test_bpb": bpb,
                "test_tokens": tokens,
                "test_bytes": n_bytes,
                "config": config_record,
            }
        )
        rows.append(f"| {args.corpus} | {model} | {ppl:.2f} | {bpb:.4f} |")
    print("\n".join(rows))
    if args.out is not None:
        meta = store.environment()
        store.write_jsonl(args.out / "results.jsonl", [{**r, **meta} for r in records])
        note = f"Bigram weight {nll['bigram_weight']:g}, chosen on the validation split; {tokens} test tokens."
        store.write_atomic(args.out / "summary.md", "# N-gram references\n\n" + "\n".join(rows) + f"\n\n{note}\n")
        print(f"results in {args.out}/results.jsonl and summary.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
