#!/usr/bin/env bash
# One prepared accelerator check: `benchmarks.step` for every study at its quick preset (fp32) and its paper
# preset (fp32 and bf16), twelve runs of at most 100 s each (not yet timed on a GPU), then the attention
# kernels in bf16; no PyTorch peer (it would time the host's CPU). Output goes
# to ${OUT:-docs/gpu}; commit it with the device named. Usage: bash benchmarks/gpu.sh
# CLI_RUN=1 adds the paper preset of 2Parity with 8 seeds through the CLI (vanilla and mask, about 4 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-docs/gpu}"
mkdir -p "$out"
# The device image already has jax, flax, optax, chex, orbax and matplotlib, and no registry: use the tree as it is.
py="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/device.txt"
"$py" -c "import jax; print(jax.__version__, jax.devices())" | tee -a "$out/device.txt"
for study in boolean arithmetic vision language; do
    timeout 100 "$py" -m benchmarks.step --study="$study" --preset=quick --seeds=1,8,64 --steps=50 --no-torch \
        | tee "$out/step_${study}_quick.txt" || echo "step $study quick: exit $?" | tee -a "$out/failures.txt"
    for dtype in float32 bfloat16; do
        timeout 100 "$py" -m benchmarks.step --study="$study" --preset=paper --seeds=1,8 --steps=10 --dtype="$dtype" --no-torch \
            | tee "$out/step_${study}_paper_${dtype}.txt" || echo "step $study paper $dtype: exit $?" | tee -a "$out/failures.txt"
    done
done
timeout 60 "$py" -m benchmarks.attention_impl --dtype=bfloat16 | tee "$out/attention_impl_bf16.txt"
if [ "${CLI_RUN:-}" = 1 ]; then
    timeout 240 "$py" -m experiments.boolean --preset=paper --seeds=8 --tasks=2parity --methods=vanilla,mask \
        --out="$out/boolean_paper_2parity" 2>&1 | tee "$out/boolean_paper_2parity.log"
fi
# The paper's Table 1 with 8 seeds (issue 16): every task, vanilla, mask, mask_fixed and both QK priors at
# the paper preset. About 130k seed-steps of 160 GFLOP each per method: hours even on an H200, so it runs
# only when asked (PAPER_TABLE=1), alone, checkpointed; rerun the same line with --resume after a stop.
if [ "${PAPER_TABLE:-}" = 1 ]; then
    "$py" -m experiments.boolean --preset=paper --seeds=8 --tasks=2parity,majority3,threesym,cyclic3 \
        --methods=vanilla,mask,mask_fixed,qk_svd,qk_opt --checkpoint-every=500 --out="$out/boolean_paper_table" \
        2>&1 | tee "$out/boolean_paper_table.log"
fi
# The vision study at the paper preset (ViT-Tiny, 200 epochs) needs CIFAR-10 on the machine: set
# CIFAR_DIR to the unpacked python version (cifar-10-batches-py). Hours, not minutes: run it alone.
if [ -n "${CIFAR_DIR:-}" ]; then
    "$py" -m experiments.vision --dataset=cifar10 --data-dir="$CIFAR_DIR" --preset=paper --seeds=1 \
        --methods=vanilla,mask,mimetic,impulse --out="$out/vision_paper_cifar10" 2>&1 | tee "$out/vision_paper_cifar10.log"
fi
# The language study at the paper preset (6 x 384, context 256, GPT-2's BPE) needs a corpus and GPT-2's
# vocab.json / merges.txt on the machine: set TINYSTORIES_DIR (TinyStories-train.txt, TinyStories-valid.txt)
# and GPT2_DIR. Hours, not minutes: run it alone.
if [ -n "${TINYSTORIES_DIR:-}" ] && [ -n "${GPT2_DIR:-}" ]; then
    "$py" -m experiments.language --corpus=tinystories --data-dir="$TINYSTORIES_DIR" --tokenizer="gpt2:$GPT2_DIR" \
        --preset=paper --seeds=4 --methods=vanilla,mask,mask_full,alibi --out="$out/language_paper_tinystories" \
        2>&1 | tee "$out/language_paper_tinystories.log"
fi
