"""Low-data arithmetic study: python -m experiments.arithmetic --seeds=8 --ops=add,mul

Every (op, training fraction, method) trains all its seeds as one vmapped group. Writes results.jsonl,
summary.md (mean +- std and per seed), config.json, seq_acc.png and mask_OP.png to --out. The study is
`maskjax.studies.arithmetic.STUDY`.
"""

import functools
import sys

from maskjax.cli import driver as cli
from maskjax.studies.arithmetic import STUDY

main = functools.partial(cli.main, STUDY)

if __name__ == "__main__":
    sys.exit(cli.run_main(main))
