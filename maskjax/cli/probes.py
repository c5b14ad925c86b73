"""Drift and gradient probes of finished runs: python -m experiments.probes DIR [DIR ...]

Reads the results.jsonl of Boolean or contrast runs (their per-chunk probes, per layer) and tabulates,
per task, method, row policy, mask contrast, optimizer and mask weight decay: how well layer 0's
attention matched the oracle target at init (`pattern_error_init`, total variation), how far layer 0's
attention moved from init by the end of training (`drift_end`, total variation, the cube's mean; on
seen and unseen probe points apart), how far the prior's logits moved (`logit_drift_end`), the raw
change |M_t - M_0| of the mask logits on open and closed entries (mean, layer 0), and the gradient
norms reaching the mask and W_Q/W_K at the first and last probe (mean over layers) with their ratio.
The paper's Theorem 1 bounds the mask's gradient through the factor sigmoid(-m) of each entry, printed
for the open logit beside the measured ratio. Writes probes.md into the first DIR, or to --out.
"""

from __future__ import annotations

import sys
from pathlib import Path

from maskjax import store, tables
from maskjax.cli.driver import Parser, run_main
from maskjax.errors import ConfigError
from maskjax.probes import end_of_run

KEYS = (
    "pattern_error_init",
    "drift_end",
    "drift_end_seen",
    "drift_end_unseen",
    "logit_drift_end",
    "mask_open_change_end",
    "mask_closed_change_end",
    "mask_first",
    "mask_last",
    "qk_first",
    "qk_last",
    "mask_over_qk_last",
    "sigmoid_minus_open",
)


GROUPS = ("task", "method", "row_policy", "open", "closed", "optimizer", "mask_wd")


def parse_args(argv: list[str] | None):
    p = Parser(prog="python -m experiments.probes", description=__doc__.splitlines()[0])
    p.add_argument("dirs", type=Path, nargs="+", help="results folders holding results.jsonl")
    p.add_argument("--out", type=Path, help="output markdown file (default: DIR/probes.md of the first DIR)")
    return p.parse_args(argv)


def probe_record(record: dict) -> dict:
    """Layer 0's drift at the end, and the first and last probe's gradient norms averaged over layers
    (None for what runs older than a probe do not carry)."""
    open_value = record.get("open_value")
    config = record.get("config", {})
    mask_decay = record.get("mask_weight_decay", config.get("mask_weight_decay"))

    return {
        "task": record["task"],
        "method": record["method"],
        "row_policy": config.get("row_policy", "-"),
        "optimizer": record.get("optimizer", config.get("optimizer", "adam")).replace("adam_l2", "adam"),
        "mask_wd": "-" if mask_decay is None else mask_decay,
        "open": open_value if open_value is not None else "-",
        "closed": record.get("closed_value", "-"),
        "seed": record["seed"],
        "pattern_error_init": record.get("pattern_error_init"),
        **dict.fromkeys(KEYS[1:]),
        **end_of_run(record),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = []
    for folder in args.dirs:
        path = folder / "results.jsonl"
        if not path.is_file():
            raise ConfigError(f"{path} does not exist")
        rows += [probe_record(r) for r in store.read_jsonl(path) if "attention_drift" in r]
    if not rows:
        raise ConfigError("no record carries probes (attention_drift, grad_norm_qk, ...)")
    table = tables.summary_table(rows, KEYS, GROUPS)
    out = args.out or args.dirs[0] / "probes.md"
    sources = ", ".join(str(d) for d in args.dirs)
    store.write_atomic(out, f"# Drift and gradient probes\n\nFrom {sources}.\n\n{table}")
    print(table, end="")
    print(f"written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
