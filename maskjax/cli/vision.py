"""ViT study: python -m experiments.vision --dataset=fashion_mnist --seeds=4 --methods=vanilla,mask,mimetic,impulse

Every (dataset, training fraction, method) trains all its seeds as one vmapped group. Writes results.jsonl
(test accuracy and loss, the mask's persistence and the attention drift per layer, curves), summary.md
(mean +- std, per seed, the mask against every other method paired by seed), config.json and plots:
curves_*.png, persistence_*.png, attention_*.png (the first test image) and mask_*.png (the learned mask
of every layer) to --out. The study is `maskjax.studies.vision.STUDY`.
"""

import functools
import sys

from maskjax.cli import driver as cli
from maskjax.studies.vision import STUDY

main = functools.partial(cli.main, STUDY)

if __name__ == "__main__":
    sys.exit(cli.run_main(main))
