#!/usr/bin/env bash
# The GPU measurements shipped in traces/gpu-* and profiles/h200-kernels/, as they were made: run from the
# repository root on a machine with one CUDA GPU and torch (no vtrain install needed); OUT names the folder that
# receives one archive per recording (trace-NAME.tgz) and results.tgz (environment, logs, kernel tables).
#   OUT=/some/dir bash validators/gpu/device_checks.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
work=$(mktemp -d)
{ nvidia-smi; python3 -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda,
torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0))"; } >"$work/env.txt" 2>&1
timeout 240 python3 validators/gpu/record_runs.py "$work/traces" >"$work/record.log" 2>&1
echo "record_runs exit $?" >>"$work/record.log"
timeout 170 python3 validators/gpu/layer_kernels.py --out "$work/kernels" --max-seconds 150 >"$work/kernels.log" 2>&1
echo "layer_kernels exit $?" >>"$work/kernels.log"
for run in "$work"/traces/*/; do
    name=$(basename "$run")
    tar czf "$OUT/trace-$name.tgz" -C "$work/traces" "$name"
done
tar czf "$OUT/results.tgz" -C "$work" env.txt record.log kernels.log kernels
tail -n 3 "$work/env.txt"
grep -v '^\s' "$work/record.log" | tail -n 20
tail -n 12 "$work/kernels.log"
ls -la "$OUT"
