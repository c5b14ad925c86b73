"""Boolean generalisation-on-the-unseen study: python -m experiments.boolean --seeds=8

Every (task, method) pair trains all its seeds as one vmapped group. Writes results.jsonl (one record per
task, method and seed), summary.md (mean +- std, with the MDI's own scores), config.json and PNG plots to
--out; results are rewritten atomically after every group. The study is `maskjax.studies.boolean.STUDY`.
"""

import functools
import sys

from maskjax.cli import driver as cli
from maskjax.studies.boolean import STUDY

main = functools.partial(cli.main, STUDY)

if __name__ == "__main__":
    sys.exit(cli.run_main(main))
