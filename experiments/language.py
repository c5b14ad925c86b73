"""Language study: python -m experiments.language --corpus=brown --seeds=4 --methods=vanilla,mask,alibi

Small causal LMs with the relative-distance mask log_sigmoid(s * M) against vanilla, ALiBi and mask
variants; every method's seeds train as one vmapped batch. Writes results.jsonl (test perplexity per
token and bits per byte, validation curve, the bias drift per layer), summary.md (mean +- std, per
seed, the mask against every method paired by seed with a sign test), config.json and plots:
curves.png (validation loss) and bias_<method>.png (the bias against distance per head, before and
after training) to --out; results are rewritten atomically after every batch.
Brown: run `python scripts/fetch_brown.py` once first.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

from experiments.cli import (
    Parser,
    add_model_flags,
    add_run_control,
    add_seeds,
    name_list,
    non_negative_float,
    positive_float,
    positive_int,
    progress,
    run_control,
    run_main,
    with_overrides,
)
from maskjax import plots, store, tables
from maskjax.data import text, tokenizer
from maskjax.runner import BatchSpec, run_sweep
from maskjax.studies import language as study
from maskjax.tasks import language as lt

KEYS = ("test_ppl", "test_bpb", "train_loss")
GROUPS = ("corpus", "method")
CURVE_KEYS = ("val_loss",)
PERSISTENCE_KEYS = ("attention_drift", "mask_change_mean", "mask_sign_kept")


def parse_args(argv: list[str] | None):
    p = Parser(prog="python -m experiments.language", description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default="brown", choices=text.CORPORA, help="default brown")
    p.add_argument("--data-dir", type=Path, help="the corpus's files: a folder, or a .txt file for --corpus=text")
    add_seeds(p, 4)
    p.add_argument(
        "--methods",
        type=name_list,
        default=["vanilla", "mask", "alibi"],
        help=f"comma list of {','.join(study.METHODS)} (default vanilla,mask,alibi)",
    )
    p.add_argument("--preset", default="quick", help=f"one of {','.join(study.PRESETS)} (default quick)")
    p.add_argument("--scale", type=positive_float, help="s in log_sigmoid(s * M) (preset: 10)")
    p.add_argument("--mask-init", choices=lt.MASK_INITS, help="initial m per head and distance (preset: window)")
    p.add_argument("--share-mask", action="store_true", help="one bias for all layers (default: one per layer)")
    p.add_argument("--tokenizer", help="bpe (trained on the training split, cached) or gpt2:DIR (local GPT-2 files)")
    p.add_argument("--vocab-size", type=positive_int, help="BPE vocabulary size (preset: 4096)")
    p.add_argument("--context", type=positive_int, help="tokens of history per prediction (preset: 128)")
    p.add_argument("--max-positions", type=positive_int, help="learned position table size (default: the context)")
    p.add_argument("--steps", type=positive_int, help="training steps")
    p.add_argument("--batch-size", type=positive_int, help="windows per step")
    p.add_argument("--learning-rate", type=positive_float, help="AdamW peak learning rate")
    p.add_argument("--weight-decay", type=non_negative_float, help="AdamW weight decay")
    add_model_flags(p)
    p.add_argument("--cache", type=Path, help="tokenizer cache folder (default ~/.cache/maskjax/tokenizers)")
    p.add_argument(
        "--out", type=Path, default=Path("results/language"), help="output folder (default results/language)"
    )
    add_run_control(p)
    return p.parse_args(argv)


def resolve_config(args) -> study.LanguageConfig:
    fields = (
        "scale",
        "mask_init",
        "tokenizer",
        "vocab_size",
        "context",
        "max_positions",
        "steps",
        "batch_size",
        "learning_rate",
        "weight_decay",
    )
    config = with_overrides(study.get_preset(args.preset), args, fields)
    if args.share_mask:
        config = dataclasses.replace(config, share_mask=True)
    study.check_config(config)
    return config


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = resolve_config(args)
    methods = study.resolve(args.methods)
    store.ensure_writable_dir(args.out)
    progress(f"reading {args.corpus}")
    corpus = text.load_corpus(args.corpus, args.data_dir)
    progress(f"tokenizing ({config.tokenizer}); " + ", ".join(f"{k} {n} docs" for k, (n, _) in corpus.sizes().items()))
    tok = tokenizer.get_tokenizer(config.tokenizer, corpus.train, config.vocab_size, args.cache)
    data = study.prepare(corpus, tok, config.context)
    progress(f"{len(data.train)} training windows of {config.context}, {int(data.test_weights.sum())} test tokens")
    resolved = {
        "study": "language",
        "corpus": args.corpus,
        "data_dir": str(args.data_dir) if args.data_dir else None,
        "methods": args.methods,
        "seeds": args.seeds,
        **dataclasses.asdict(config),
    }
    out = args.out

    def maps_path(method: str) -> Path:
        return out / "maps" / f"{data.corpus}_{method}.npz"

    def batch(method) -> BatchSpec:
        def train(checkpoints, resume: bool) -> list[dict]:
            records, maps = study.run_batch(data, method, args.seeds, config, progress, checkpoints, resume)
            if maps:
                store.write_maps(maps_path(method.name), maps)
            return records

        fields = {"corpus": data.corpus, "method": method.name}
        return BatchSpec(f"{data.corpus}_{method.name}", fields, len(args.seeds), train)

    def plot(records: list[dict]) -> None:
        plot_curves(records, out / "curves.png")
        plots.plot_drift(records, out / "persistence.png", PERSISTENCE_KEYS)
        for method in dict.fromkeys(r["method"] for r in records):
            if maps_path(method).exists():
                plot_bias(store.read_maps(maps_path(method)), config.scale, method, out / f"bias_{method}.png")

    specs = [batch(method) for method in methods]
    records = run_sweep(out, resolved, specs, write_outputs, run_control(args), progress, plot)
    print(write_outputs(out, records), end="")
    print(f"results in {out}/ (results.jsonl, summary.md, config.json, *.png)", file=sys.stderr)
    return 0


def write_outputs(out: Path, records: list[dict]) -> str:
    store.write_jsonl(out / "results.jsonl", records)
    table = tables.summary_table(records, KEYS, GROUPS)
    parts = [
        table,
        tables.paired_table(records, "test_ppl", "mask", ("corpus",), lower_is_better=True),
        tables.per_seed_table(records, "test_ppl", GROUPS),
        tables.per_seed_table(records, "test_bpb", GROUPS),
    ]
    store.write_atomic(out / "summary.md", "# Language study\n\n" + "\n".join(parts))
    return table


def plot_curves(records: list[dict], path: Path) -> None:
    """Validation loss on the probe windows against step, per method (mean over seeds, range shaded)."""
    plots.plot_step_curves(records, path, CURVE_KEYS)


BIAS_FLOOR = -15.0  # below this an entry is closed for any q.k logit of a small model; the plot clips there


def plot_bias(maps: dict[str, np.ndarray], scale: float, method: str, path: Path) -> None:
    """The paper's Figure 8: per layer, the bias log_sigmoid(s * m) against distance for every head, at init
    (dashed) and after training (solid), seed 0; the y axis stops at BIAS_FLOOR so the open reach shows."""
    init, final = (np.asarray(maps[k], np.float64) for k in ("mask_init", "mask_final"))
    columns = min(len(final), plots.PANELS_PER_ROW)
    fig, axes = plots.figure(-(-len(final) // columns), columns, 3.6, 3.0)
    for ax in axes.flat[len(final) :]:
        ax.axis("off")
    distance = np.arange(final.shape[-1])
    for layer, ax in zip(range(len(final)), axes.flat, strict=False):
        for head in range(final.shape[1]):
            (line,) = ax.plot(distance, -np.logaddexp(0.0, -scale * final[layer, head]), label=f"head {head}")
            ax.plot(distance, -np.logaddexp(0.0, -scale * init[layer, head]), "--", color=line.get_color(), alpha=0.6)
        ax.set_ylim(BIAS_FLOOR, 0.5)
        ax.set_title(f"{method}: layer {layer}" if len(final) > 1 else f"{method}: all layers", fontsize=9)
        ax.set_xlabel("distance i - j")
        ax.set_ylabel("log_sigmoid(s m)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    plots.save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(run_main(main))
