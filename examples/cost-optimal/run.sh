#!/bin/sh
# Cost-optimal parallelisation of MT-NLG 530B and GPT-3 175B on the shipped A100 profile: every plan on a few
# GPU counts around the original one, then what the best plans save over the original plan (plans/savings.md).
# About 21 s of wall time on a 2-core machine (load 1.4; 22 s of CPU time). Plans go to plans/.
set -e
VTRAIN="${VTRAIN:-vtrain}"
$VTRAIN plan examples/cost-optimal/mtnlg-530b.yaml --gpus 1680,2240,2520,2800,3360 --profile profiles/a100 \
    --device A100-80GB --tokens 270e9 --max-micro-batch 2 -o plans/mtnlg-530b-80gb --force
$VTRAIN plan examples/cost-optimal/mtnlg-530b.yaml --gpus 1680,2240,2520,2800,3360 --profile profiles/a100 \
    --device A100 --tokens 270e9 --max-micro-batch 2 -o plans/mtnlg-530b-40gb --force
$VTRAIN plan examples/cost-optimal/gpt3-175b.yaml --gpus 512,768,1024,1536 --profile profiles/a100 \
    --device A100-80GB --tokens 300e9 --max-micro-batch 2 -o plans/gpt3-175b-80gb --force
${PYTHON:-python} -m vtrain.cli.savings plans/mtnlg-530b-80gb plans/mtnlg-530b-40gb plans/gpt3-175b-80gb \
    | tee plans/savings.md
