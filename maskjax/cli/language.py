"""Language study: python -m experiments.language --corpus=brown --seeds=4 --methods=vanilla,mask,alibi

Small causal LMs with the relative-distance mask log_sigmoid(s * M) against vanilla, ALiBi and mask
variants; every method's seeds train as one vmapped group. Writes results.jsonl (test perplexity per
token and bits per byte, validation curve, the bias drift per layer), summary.md (mean +- std, per
seed, the mask against every method paired by seed with a sign test), config.json and plots:
curves.png (validation loss), persistence.png and bias_<method>.png (the bias against distance per head,
before and after training) to --out. Brown: run `python scripts/fetch_brown.py` once first. The study is
`maskjax.studies.language.STUDY`.
"""

import functools
import sys

from maskjax.cli import driver as cli
from maskjax.studies.language import STUDY

main = functools.partial(cli.main, STUDY)

if __name__ == "__main__":
    sys.exit(cli.run_main(main))
