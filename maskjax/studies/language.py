"""The language study: a small causal LM per (corpus, method), all seeds one vmapped group.

The prior is the paper's relative-distance mask used as log_sigmoid(s * M): by default one learnable
logit per head and distance (a Toeplitz bias, `mask`), or one per entry (`mask_full`); `alibi` is the
fixed ALiBi bias, a published control. Every run trains on the same packed windows of the training
split; after every chunk a probe measures the validation loss on fixed windows, how far the bias moved
(as a function of distance) and how far layer 0's attention drifted. At the end the whole test split
is scored: perplexity per token and bits per byte.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from maskjax import mask_patterns, plots, probes, qk_priors, runs, tables
from maskjax.attention import toeplitz_logits
from maskjax.data import text, tokenizer
from maskjax.errors import ConfigError
from maskjax.methods import Method
from maskjax.models.causal import CausalTransformer
from maskjax.models.layers import ModelConfig
from maskjax.optim import OptimizerConfig, TrainConfig
from maskjax.overrides import option, with_default
from maskjax.sharding import to_host
from maskjax.study import Group, Plan, Study, register
from maskjax.tasks import language as lt
from maskjax.train import Trained, TrainInputs, variables_of


@dataclasses.dataclass(frozen=True, kw_only=True)
class LanguageConfig(OptimizerConfig):
    """scale: s in log_sigmoid(s * M) (the paper's 10, chosen by hand); mask_init: `lt.MASK_INITS`;
    share_mask: one bias for all layers instead of one per layer; max_positions: the learned position
    table's size (default: the context), which the context must not exceed."""

    preset: str
    model: ModelConfig
    context: int = option(help="tokens of history per prediction")
    steps: int = option(help="training steps")
    vocab_size: int = option(4096, help="BPE vocabulary size")
    tokenizer: str = option("bpe", help="bpe (trained on the training split, cached) or gpt2:DIR (local GPT-2 files)")
    batch_size: int = option(32, help="windows per step")
    learning_rate: float = option(1e-3, above=0, help="AdamW peak learning rate")
    weight_decay: float = with_default(OptimizerConfig, "weight_decay", 0.1)
    warmup_fraction: float = option(0.05, minimum=0, below=1, help="share of the steps in linear warmup")
    clip_norm: float | None = option(1.0, above=0, help="clip the gradient's global norm (none: no clipping)")
    scale: float = option(10.0, above=0, help="s in log_sigmoid(s * M)")
    mask_init: str = option("window", choices=lt.MASK_INITS, help="initial m per head and distance")
    share_mask: bool = option(False, help="one bias for all layers (default: one per layer)")
    max_positions: int | None = option(None, help="learned position table size (default: the context)")
    chunk_steps: int = with_default(OptimizerConfig, "chunk_steps", 100)
    val_windows: int = option(32, help="validation windows of the per-chunk probe")
    drift_windows: int = option(4, help="windows of the attention-drift probe")
    eval_batch: int = option(32, help="test windows scored at once")
    qk_position_scale: float = option(
        qk_priors.POSITION_SCALE, above=0, help="factor on the position embeddings under the QK-SVD and QK-opt priors"
    )

    def train_config(self) -> TrainConfig:
        warmup = int(self.warmup_fraction * self.steps)
        return self.optimizer_config(
            self.steps,
            self.batch_size,
            self.learning_rate,
            schedule="cosine",
            warmup_steps=warmup,
            clip_norm=self.clip_norm,
        )


PRESETS: dict[str, LanguageConfig] = {
    # For an accelerator, near the paper's small models: GPT-2 BPE (pass --tokenizer=gpt2:DIR), 6 x 384,
    # context 256, AdamW with warmup and cosine decay.
    "paper": LanguageConfig(
        preset="paper",
        model=ModelConfig(dim=384, depth=6, heads=6, head_dim=64, mlp_dim=1536),
        context=256,
        steps=20_000,
        vocab_size=50_257,
        batch_size=64,
        learning_rate=6e-4,
        chunk_steps=500,
        val_windows=128,
        eval_batch=64,
    ),
    # Sized for the 2-core CPU before any mask result (docs/results/language_quick.md says how): 4 layers of
    # width 64, context 128, a 4096-token BPE; 300 steps of 32 windows, 0.9 epochs of Brown's training split.
    "quick": LanguageConfig(
        preset="quick",
        model=ModelConfig(dim=64, depth=4, heads=4, head_dim=16, mlp_dim=256),
        context=128,
        steps=300,
    ),
    # Named by docs/design.md's rule ("Sizes that learn"): the first rung at which vanilla's test bits per
    # byte are below the bigram on the same tokens in every seed (docs/results/language_ladder.md):
    # 4 x 128 on a 1024-token BPE, 2,000 steps of 32 windows of 128 tokens.
    "medium": LanguageConfig(
        preset="medium",
        model=ModelConfig(dim=128, depth=4, heads=4, head_dim=32, mlp_dim=512),
        context=128,
        steps=2000,
        vocab_size=1024,
    ),
    "test": LanguageConfig(
        preset="test",
        model=ModelConfig(dim=16, depth=2, heads=2, head_dim=8, mlp_dim=32),
        context=8,
        steps=6,
        vocab_size=300,
        batch_size=4,
        chunk_steps=3,
        val_windows=4,
        drift_windows=2,
        eval_batch=4,
        qk_opt_steps=20,
    ),
}


class LanguageData(NamedTuple):
    """A corpus tokenized and packed (`lt.pack`): training windows, and validation / test windows with
    their weights, and what the scores divide by."""

    corpus: str
    tokenizer: str
    vocab_size: int
    train: np.ndarray
    val: np.ndarray
    val_weights: np.ndarray
    test: np.ndarray
    test_weights: np.ndarray
    test_bytes: int


def check_config(config: LanguageConfig) -> None:
    """Refuse a config that cannot be built, before any text is read."""
    if config.max_positions is not None and config.context > config.max_positions:
        raise ConfigError(f"context {config.context} is longer than the position table ({config.max_positions})")
    lt.relative_mask_logits(1, 1, config.mask_init)


def prepare(corpus, tokenizer, context: int) -> LanguageData:
    """Tokenize a `maskjax.data.text.TextCorpus` and pack its splits into windows of `context` predictions."""
    splits = {}
    for name in ("train", "validation", "test"):
        documents = getattr(corpus, name)
        stream = lt.token_stream(tokenizer.encode_batch(list(documents)), tokenizer.eos_id)
        try:
            splits[name] = lt.pack(stream, context, keep_partial=name != "train")
        except ConfigError as e:
            raise ConfigError(f"{corpus.name} {name} split: {e}") from None
    return LanguageData(
        corpus.name,
        tokenizer.name,
        tokenizer.vocab_size,
        splits["train"][0],
        *splits["validation"],
        *splits["test"],
        lt.split_bytes(corpus.test),
    )


def mask_structure(method: Method) -> str:
    return "full" if method.mask_structure == "full" else "toeplitz"


def initial_mask(method: Method, config: LanguageConfig) -> np.ndarray:
    """The method's initial mask as stored: [heads, context] per distance, or its expansion
    [heads, context, context] for a full mask; zeros for `mask_zero`."""
    heads = config.model.heads
    kind = "zero" if method.mask_pattern == "zero" else config.mask_init
    relative = lt.relative_mask_logits(heads, config.context, kind)
    if mask_structure(method) == "toeplitz":
        return relative
    return np.asarray(toeplitz_logits(jnp.asarray(relative), config.context, config.context))


def window_prior(config: LanguageConfig) -> tuple[np.ndarray, np.ndarray]:
    """The relative window as the QK priors take it (issue 44: the same prior injected through W_Q W_K):
    per head, the open pattern [heads, context, context] (keys 0..w_h - 1 tokens back) and the attention
    the mask asks for at init, softmax of log_sigmoid(s * M) over the visible keys."""
    context = config.context
    distance = np.arange(context)[:, None] - np.arange(context)[None, :]
    widths = lt.window_widths(config.model.heads)[:, None, None]
    pattern = (distance >= 0) & (distance < widths)
    relative = jnp.asarray(lt.relative_mask_logits(config.model.heads, context, config.mask_init))
    full = np.asarray(toeplitz_logits(relative, context, context), np.float64)
    target = mask_patterns.row_distribution(np.where(distance >= 0, config.scale * full, -np.inf))
    return pattern.astype(np.float32), target.astype(np.float32)


def make_model(vocab: int, method: Method, config: LanguageConfig, mask_init=None) -> CausalTransformer:
    return CausalTransformer(
        vocab,
        config.max_positions or config.context,
        config.model,
        method.mask_mode,
        mask_init,
        method.qk_norm,
        mask_scale=config.scale,
        mask_structure=mask_structure(method),
        share_mask=config.share_mask,
        position_bias="alibi" if method.position_bias == "alibi_matched" else method.position_bias,
        alibi_slopes=matched_slopes(config) if method.position_bias == "alibi_matched" else None,
    )


def matched_slopes(config: LanguageConfig) -> tuple[float, ...]:
    """ALiBi slopes matched to the mask's initial window: beyond its width w_h the window's bias
    log_sigmoid(s (1 - d / w_h)) falls by about s / w_h per token (5 to 0.625 at s = 10, w_h = 2..16), where
    the paper's ALiBi slopes are 1/4 to 1/256 (issue 44: a control for 'a recency prior against none')."""
    return tuple(float(config.scale / w) for w in lt.window_widths(config.model.heads))


def window_nll(logits_BLV: jax.Array, windows_BW: jax.Array) -> jax.Array:
    """Next-token negative log-likelihood per position [batch, context]."""
    return optax.softmax_cross_entropy_with_integer_labels(logits_BLV, windows_BW[:, 1:])


def mask_profiles(model: CausalTransformer, method: Method, variables: dict) -> jax.Array:
    """Every layer's mask as a function of distance, [layers, heads, context] (one row when shared)."""
    collection = variables["params" if method.mask_mode == "learnable" else "constants"]
    if model.share_mask:
        masks = [collection["shared_mask"]["mask_logits"]]
    else:
        masks = [collection[f"block_{i}"]["attn"]["mask_logits"] for i in range(model.config.depth)]
    stacked = jnp.stack(masks)
    if stacked.ndim == 3:
        return stacked
    n = stacked.shape[-1]
    rows = jnp.arange(n)[:, None]
    keys = rows - jnp.arange(n)[None, :]
    visible = (keys >= 0).astype(stacked.dtype)
    gathered = jnp.take_along_axis(stacked, jnp.broadcast_to(jnp.clip(keys, 0, None), stacked.shape), axis=-1)
    return (gathered * visible).sum(-2) / visible.sum(-2)


class LanguageGroup(NamedTuple):
    """What one group trains: a tokenized corpus, by a method."""

    data: LanguageData
    method: Method


class LanguageInputs(NamedTuple):
    """One group's training inputs, and what its records need."""

    inputs: TrainInputs
    model: CausalTransformer
    drift_windows: jax.Array
    window_attention: np.ndarray


def make_group(group: LanguageGroup, seeds: Sequence[int], config: LanguageConfig) -> LanguageInputs:
    """The one-run init, loss and probe of (corpus, method) and every seed's key and initial mask; all runs
    share the training windows. The probe measures after every chunk the validation loss on fixed windows,
    the attention's drift and its distance to the window's attention, per layer, and for a mask how far it
    moved as a function of distance."""
    data, method = group
    model = make_model(data.vocab_size, method, config)
    train_windows = jnp.asarray(data.train)
    pattern_HNN, target_HNN = window_prior(config)
    init_run = runs.prior_init(
        lambda mask_logits: make_model(data.vocab_size, method, config, mask_logits),
        method,
        train_windows[:1, :-1],
        jnp.asarray(pattern_HNN),
        jnp.asarray(target_HNN),
        config.qk_opt_steps,
        config.qk_position_scale,
    )

    def loss(params, constants, windows_BW):
        return window_nll(model.apply(variables_of(params, constants), windows_BW[:, :-1]), windows_BW).mean()

    val_x = jnp.asarray(data.val[: config.val_windows])
    val_w = jnp.asarray(data.val_weights[: config.val_windows])
    drift_x = val_x[: config.drift_windows, :-1]
    window_HNN = jnp.asarray(target_HNN)

    def probe(initial, state) -> dict[str, jax.Array]:
        variables = variables_of(state.params, state.constants)
        start = variables_of(initial.params, initial.constants)
        nll = window_nll(model.apply(variables, val_x[:, :-1]), val_x)
        attention_LBHNN = runs.sown(model, variables, drift_x, "attention")
        out = {
            "val_loss": (nll * val_w).sum() / val_w.sum(),
            "attention_drift": runs.attention_drift(model, start, variables, drift_x),
            # every layer's distance to the window's attention (the prior every method is held against)
            "window_distance": 0.5 * jnp.abs(attention_LBHNN - window_HNN).sum(-1).mean((1, 2, 3)),
        }
        if method.mask_mode != "none":
            out |= probes.mask_persistence(mask_profiles(model, method, start), mask_profiles(model, method, variables))
        return out

    run_masks = jnp.asarray(np.stack([initial_mask(method, config)] * len(seeds)))
    inputs = TrainInputs(
        init_run, loss, runs.seed_keys(seeds), (run_masks,), train_windows, config.train_config(), probe=probe
    )
    return LanguageInputs(inputs, model, drift_x, np.asarray(target_HNN))


def record_group(
    group: LanguageGroup,
    seeds: Sequence[int],
    config: LanguageConfig,
    built: LanguageInputs,
    trained: Trained,
    started: float,
) -> tuple[list[dict], dict[str, np.ndarray]]:
    """One record per seed of a trained (corpus, method) group: the whole test split scored, perplexity per
    token and bits per byte; and, for the plots, seed 0's bias per layer, head and distance at init and after
    training."""
    data, method = group
    model = built.model
    initial, final, curves, curve_steps = trained.initial, trained.final, trained.probes, trained.probe_steps
    nll_sum, tokens = score(model, final, data.test, data.test_weights, config.eval_batch)
    outcomes = runs.outcome_fields(trained, built.inputs.train_config, time.time() - started, ~np.isfinite(nll_sum))
    # how near each run's layer 0 starts to the window's attention, on the drift probe's windows
    pattern_error = runs.layer0_pattern_error(model, initial, built.drift_windows, built.window_attention)
    records = []
    for i, seed in enumerate(seeds):
        diverged = outcomes[i]["diverged"]
        records.append(
            {
                "corpus": data.corpus,
                "tokenizer": data.tokenizer,
                "method": method.name,
                "seed": int(seed),
                "scale": config.scale,
                "test_ppl": None if diverged else lt.perplexity(float(nll_sum[i]), tokens),
                "test_bpb": None if diverged else lt.bits_per_byte(float(nll_sum[i]), data.test_bytes),
                "test_tokens": int(tokens),
                "test_bytes": int(data.test_bytes),
                "train_windows": int(len(data.train)),
                "pattern_error_init": pattern_error[i],
                "drift_steps": curve_steps,
                **runs.stored_curves(curves, i),
                **outcomes[i],
            }
        )
    maps = {}
    if method.mask_mode != "none":
        start, end = (jax.tree.map(lambda a: a[0], s) for s in (initial, final))
        maps["mask_init"] = to_host(mask_profiles(model, method, variables_of(start.params, start.constants)))
        maps["mask_final"] = to_host(mask_profiles(model, method, variables_of(end.params, end.constants)))
    return records, maps


def score(model: CausalTransformer, state, windows: np.ndarray, weights: np.ndarray, eval_batch: int):
    """Per run, the summed negative log-likelihood over every weighted target of `windows` ([runs], float64),
    and the number of targets. A last partial chunk's filler windows weigh 0."""

    def chunk_nll(variables, batch, filler):
        windows_BW, weights_BL = batch
        if filler is not None:
            weights_BL = weights_BL * filler[:, None]
        return (window_nll(model.apply(variables, windows_BW[:, :-1]), windows_BW) * weights_BL).sum()

    nll = runs.evaluate_runs(chunk_nll, state, [windows, weights], eval_batch)
    return nll.astype(np.float64), float(weights.sum())


def ladder_rule(records: Sequence[dict], bigram_bpb: float) -> dict:
    """docs/design.md's rule for one rung: vanilla's test bits per byte below the bigram counted on the
    same tokens, in every seed."""
    below = [r["test_bpb"] is not None and r["test_bpb"] < bigram_bpb for r in records]
    return runs.seed_verdict(below, share=1.0)


@dataclasses.dataclass(frozen=True)
class LanguageScope:
    corpus: str = option("brown", choices=text.CORPORA, help="the corpus")
    data_dir: Path | None = option(None, help="the corpus's files: a folder, or a .txt file for --corpus=text")
    cache: Path | None = option(None, record=False, help="tokenizer cache folder (default ~/.cache/maskjax/tokenizers)")


KEYS = ("test_ppl", "test_bpb", "train_loss")
GROUPS = ("corpus", "method")
CURVE_KEYS = ("val_loss",)
PERSISTENCE_KEYS = ("attention_drift", "window_distance", "mask_change_mean", "mask_sign_kept")
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


class LanguageStudy(Study):
    """Every method is one group over its seeds, on one tokenized corpus."""

    name = "language"
    title = "Language study"
    description = "Language study: python -m experiments.language --corpus=brown --seeds=4 --methods=vanilla,mask,alibi"
    config_type = LanguageConfig
    scope_type = LanguageScope
    presets = PRESETS
    default_seeds = 4
    default_methods = ("vanilla", "mask", "alibi")

    def check(self, config: LanguageConfig, scope: LanguageScope) -> None:
        check_config(config)

    def make_data(self, config: LanguageConfig, scope: LanguageScope, log) -> LanguageData:
        log(f"reading {scope.corpus}")
        corpus = text.load_corpus(scope.corpus, scope.data_dir)
        sizes = ", ".join(f"{k} {n} docs" for k, (n, _) in corpus.sizes().items())
        log(f"tokenizing ({config.tokenizer}); {sizes}")
        tok = tokenizer.get_tokenizer(config.tokenizer, corpus.train, config.vocab_size, scope.cache)
        data = prepare(corpus, tok, config.context)
        log(f"{len(data.train)} training windows of {config.context}, {int(data.test_weights.sum())} test tokens")
        return data

    def sample_data(self, config: LanguageConfig, scope: LanguageScope) -> LanguageData:
        """512 random windows of the context and vocabulary: what a step reads, without a corpus."""
        windows = np.random.default_rng(0).integers(0, config.vocab_size, (512, config.context + 1)).astype(np.int32)
        weights = np.ones((512, config.context), np.float32)
        return LanguageData("random", "none", config.vocab_size, windows, windows, weights, windows, weights, 1)

    def groups(self, plan: Plan) -> list[Group[LanguageGroup]]:
        return [
            Group({"corpus": plan.data.corpus, "method": m.name}, LanguageGroup(plan.data, m)) for m in plan.methods
        ]

    def build(self, config: LanguageConfig, spec: LanguageGroup, seeds: Sequence[int]) -> LanguageInputs:
        return make_group(spec, seeds, config)

    def record(self, config, spec: LanguageGroup, seeds, built: LanguageInputs, trained: Trained, started: float):
        return record_group(spec, seeds, config, built, trained, started)

    def summary(self, plan: Plan, records: list[dict], reference: list[dict]) -> tuple[str, str]:
        table = tables.summary_table(records, KEYS, GROUPS)
        parts = [
            table,
            tables.paired_table(records, "test_ppl", "mask", ("corpus",), lower_is_better=True),
            tables.per_seed_table(records, "test_ppl", GROUPS),
            tables.per_seed_table(records, "test_bpb", GROUPS),
        ]
        return "\n".join(part for part in parts if part), table

    def plot(self, plan: Plan, records: list[dict], reference: list[dict], maps) -> None:
        plots.plot_step_curves(records, plan.out / "curves.png", CURVE_KEYS)
        plots.plot_drift(records, plan.out / "persistence.png", PERSISTENCE_KEYS)
        for method in dict.fromkeys(r["method"] for r in records):
            if (arrays := maps({"corpus": plan.data.corpus, "method": method})) is not None:
                plot_bias(arrays, plan.config.scale, method, plan.out / f"bias_{method}.png")


STUDY = register(LanguageStudy())
