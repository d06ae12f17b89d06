#!/usr/bin/env bash
# `make demo`: the whole facetrain pipeline on the built-in synthetic faces, on 2 CPU processes.
#
# Generates the dataset (once), trains a small backbone with the class-sharded margin head over two
# ranks, evaluates it on held-out identities (a table and a ROC plot), exports it (safetensors,
# TorchScript and ONNX checked against PyTorch), compares two held-out pairs of images, and prints
# where everything went. Measured on 2 cores: 3 min 17 s from a fresh clone on a quiet machine
# (docs/benchmarks.md), 9-13 minutes with other work beside it.
#
# Re-running is safe: each run trains into a fresh directory named after the time it started, since
# the trainer refuses to train over an earlier run's checkpoints and a second demo should show the
# whole pipeline again rather than resume a finished run. The dataset is generated only if absent.
#
# The tests run this script at a reduced size through these variables:
#   DEMO_DATA        dataset folder (default data/synth)
#   DEMO_RUN         run directory (default runs/demo-<date-time>)
#   DEMO_SYNTH_ARGS  extra arguments for `facetrain synth`, e.g. "--identities 8"
#   DEMO_TRAIN_ARGS  extra arguments for `facetrain train`, e.g. "--set train.steps=4"
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -x .venv/bin/facetrain ]]; then
    FACETRAIN="$PWD/.venv/bin/facetrain"
else
    FACETRAIN=facetrain
fi
DATA="${DEMO_DATA:-data/synth}"
RUN="${DEMO_RUN:-runs/demo-$(date +%Y%m%d-%H%M%S)}"
PAIRS="$DATA/heldout/pairs.txt"
read -r -a SYNTH_ARGS <<< "${DEMO_SYNTH_ARGS:-}"
read -r -a TRAIN_ARGS <<< "${DEMO_TRAIN_ARGS:-}"

step() { printf '\n== %s\n' "$*"; }
started=$SECONDS
echo "make demo: about 3-4 minutes on 2 quiet cores, 9-13 with other work beside it"

step "1/5 synthetic dataset in $DATA"
if [[ -f "$PAIRS" ]]; then
    echo "found $PAIRS; keeping the existing dataset (delete $DATA to generate it again)"
else
    "$FACETRAIN" synth -o "$DATA" "${SYNTH_ARGS[@]}"
fi

step "2/5 training on 2 CPU ranks into $RUN"
"$FACETRAIN" train -c configs/demo.yaml --nproc 2 \
    --set "train.output_dir=$RUN" --set "data.path=$DATA" --set "eval.pairs=$PAIRS" "${TRAIN_ARGS[@]}"

step "3/5 verification on the held-out identities"
"$FACETRAIN" eval "$RUN/checkpoints/best" --pairs "$PAIRS" --device cpu -o "$RUN/eval" -q
# named after the pairs file's folder and stem plus a hash of its path: heldout-pairs-<hash>
REPORT=$(find "$RUN/eval" -maxdepth 1 -name 'heldout-pairs-*.json' | head -n 1)

# The evaluation report goes into the model card, so `compare` decides at the threshold just printed.
step "4/5 export (safetensors, TorchScript, ONNX)"
"$FACETRAIN" export "$RUN/checkpoints/best" -o "$RUN/export" --formats safetensors,torchscript,onnx \
    --evaluation "$REPORT" -q

step "5/5 comparing held-out faces with the exported model"
mapfile -t people < <(find "$DATA/heldout" -mindepth 1 -maxdepth 1 -type d | sort | head -n 2)
mapfile -t first_person < <(find "${people[0]}" -type f | sort | head -n 2)
second_person=$(find "${people[1]}" -type f | sort | head -n 1)
echo "same person:      ${first_person[0]} ${first_person[1]}"
"$FACETRAIN" compare "$RUN/export" "${first_person[0]}" "${first_person[1]}" --device cpu
echo "different people: ${first_person[0]} $second_person"
"$FACETRAIN" compare "$RUN/export" "${first_person[0]}" "$second_person" --device cpu

step "done in $((SECONDS - started)) s; outputs:"
echo "  training log and checkpoints  $RUN/ ($RUN/checkpoints/best is the best one)"
echo "  evaluation table and ROC      $REPORT, ${REPORT%.json}_roc.png"
echo "  exported model and its card   $RUN/export/ (model.onnx, model.safetensors, model.json)"
echo "  try: $FACETRAIN compare $RUN/export IMG1 IMG2"
