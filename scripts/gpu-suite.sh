#!/usr/bin/env bash
# The whole GPU run, as executed on the GPU machine from a copy of this tree
# with the staged executables in .gpu/bin (see ../shared/gpu/stage):
#
#   scripts/gpu-suite.sh OUTDIR
#
# 1. the contract suite, twice (the second run must give the same verdicts);
# 2. the GPU-only integration tests (fault isolation, the training step);
# 3. compute-sanitizer memcheck, racecheck and initcheck over the cuda op-parity trials;
# 4. the criterion kernel benches, when staged.
# Everything lands in OUTDIR; a short summary is printed last.
set -uo pipefail
out=${1:?usage: scripts/gpu-suite.sh OUTDIR}
bin=.gpu/bin
mkdir -p "$out"
# The driver's on-disk JIT cache would hide module-load cost from pre-warm timings.
export CUDA_CACHE_DISABLE=1

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu \
  --format=csv > "$out/gpu.txt" 2>&1

"$bin/contracts" --test-threads 1 > "$out/run1.log" 2>&1
echo "run1 exit $?" >> "$out/summary.txt"
cp reports/latest/falsification.csv "$out/falsification.csv"
[ -f reports/latest/speedups.csv ] && cp reports/latest/speedups.csv "$out/speedups.csv"
[ -f reports/latest/run.json ] && cp reports/latest/run.json "$out/run.json"

"$bin/contracts" --test-threads 1 > "$out/run2.log" 2>&1
echo "run2 exit $?" >> "$out/summary.txt"
cp reports/latest/falsification.csv "$out/falsification-rerun.csv"

"$bin/gpu_fault_isolation" --ignored --test-threads 1 --nocapture > "$out/fault.log" 2>&1
echo "fault isolation exit $?" >> "$out/summary.txt"
"$bin/train_gpu" --ignored --test-threads 1 > "$out/train-gpu.log" 2>&1
echo "train_gpu exit $?" >> "$out/summary.txt"

for tool in memcheck racecheck initcheck; do
  timeout 110 compute-sanitizer --tool "$tool" --print-limit 20 \
    "$bin/contracts" --test-threads 1 --skip ::mutant kernel-parity > "$out/sanitizer-$tool.log" 2>&1
  echo "sanitizer $tool exit $? :: $(grep 'ERROR SUMMARY' "$out/sanitizer-$tool.log" | tail -1)" >> "$out/summary.txt"
done

if [ -x "$bin/kernels" ]; then
  timeout 100 "$bin/kernels" --bench --warm-up-time 0.5 --measurement-time 1 > "$out/bench-kernels.log" 2>&1
  echo "bench kernels exit $?" >> "$out/summary.txt"
fi

grep -h "test result" "$out"/run1.log "$out"/run2.log "$out"/fault.log "$out"/train-gpu.log >> "$out/summary.txt"
cat "$out/gpu.txt" "$out/summary.txt"
