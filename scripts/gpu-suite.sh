#!/usr/bin/env bash
# The whole GPU run, executed on the GPU machine from a copy of this tree with
# the staged executables in .gpu/bin (`../shared/gpu/stage --benches`):
#
#   scripts/gpu-suite.sh OUTDIR [all|suite|sanitizers|benches]
#
# Stage first: `../shared/gpu/stage --benches` and
# `cp target/release/falsify .gpu/bin/falsify-cli` (the fault-isolation test
# starts trial processes of the CLI).
#
# Part `suite` (about 12 minutes on an H200, each trial in its own process;
# more than one device call allows: run the two suite runs in separate calls):
# 1. the contract suite, twice (scripts/compare-verdicts.py says whether the
#    two runs gave the same verdicts);
# 2. the GPU-only integration tests (fault isolation, out of memory, training step).
# Part `sanitizers`:
# 3. compute-sanitizer memcheck, initcheck and racecheck over the cuda
#    op-parity trials.
# Part `benches`:
# 4. the criterion benches (kernels, training step);
# 5. when .gpu/bin/step_profile is there (examples/step_profile.rs), one
#    qwen2.5-0.5b step timed per mode and profiled kernel by kernel with ncu.
# `all` (the default) runs every part; the device tool's 10-minute limit per
# call may need the parts in separate calls. Everything is packed into
# OUTDIR/suite-PART.tgz (the device tool returns at most 8 files); a short
# summary is printed last.
set -uo pipefail
out=${1:?usage: scripts/gpu-suite.sh OUTDIR [all|suite|sanitizers|benches]}
part=${2:-all}
case "$part" in
  all|suite|sanitizers|benches) ;;
  *) echo "unknown part '$part': all, suite, sanitizers or benches" >&2; exit 2 ;;
esac
runs() { [ "$part" = all ] || [ "$part" = "$1" ]; }
bin=.gpu/bin
work=$(mktemp -d)/suite
mkdir -p "$work"
# The driver's on-disk JIT cache would hide module-load cost from pre-warm timings.
export CUDA_CACHE_DISABLE=1
note() { echo "$*" >> "$work/summary.txt"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu \
  --format=csv > "$work/gpu.txt" 2>&1

if runs suite; then
  "$bin/contracts" --test-threads 1 > "$work/run1.log" 2>&1
  note "run1 exit $?"
  cp reports/latest/falsification.csv reports/latest/speedups.csv reports/latest/run.json "$work/"
  "$bin/contracts" --test-threads 1 > "$work/run2.log" 2>&1
  note "run2 exit $?"
  cp reports/latest/falsification.csv "$work/falsification-rerun.csv"
  note "rerun :: $(python3 scripts/compare-verdicts.py "$work/falsification.csv" "$work/falsification-rerun.csv")"

  for t in gpu_fault_isolation train_gpu fault_scope; do
    "$bin/$t" --ignored --test-threads 1 --nocapture > "$work/$t.log" 2>&1
    note "$t exit $?"
  done
  # Not --ignored: these run wherever NVRTC loads and are ignored elsewhere.
  "$bin/nvrtc" > "$work/nvrtc.log" 2>&1
  note "nvrtc exit $?"
fi

if runs sanitizers; then
  for tool in memcheck initcheck racecheck; do
    timeout 200 compute-sanitizer --tool "$tool" --print-limit 20 \
      "$bin/contracts" --test-threads 1 --skip ::mutant kernel-parity > "$work/sanitizer-$tool.log" 2>&1
    note "sanitizer $tool exit $? :: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$work/sanitizer-$tool.log" | tail -1)"
  done
fi

if runs benches; then
  if [ -x "$bin/kernels" ]; then
    timeout 120 "$bin/kernels" --bench --warm-up-time 0.5 --measurement-time 1 > "$work/bench-kernels.log" 2>&1
    note "bench kernels exit $?"
  fi
  if [ -x "$bin/train_step" ]; then
    timeout 120 "$bin/train_step" --bench > "$work/bench-train-step.log" 2>&1
    note "bench train_step exit $?"
  fi

  # One qwen2.5-0.5b step of the fast configuration, timed and profiled kernel
  # by kernel (the example binary, copied into .gpu/bin by hand: stage copies
  # tests and benches only).
  if [ -x "$bin/step_profile" ]; then
    {
      for mode in "--graph --tf32-backward --keep-mlp" "--tf32-backward --keep-mlp" "--graph" ""; do
        timeout 60 "$bin/step_profile" qwen2.5-0.5b $mode --steps 20 2>&1 | tail -1
      done
      timeout 150 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \
        --csv "$bin/step_profile" qwen2.5-0.5b --tf32-backward --keep-mlp --steps 3 > "$work/ncu-step.csv" 2>&1
      echo "one eager step under ncu (exit $?):"
      python3 scripts/ncu-kernel-times.py "$work/ncu-step.csv" 32
    } > "$work/profile-qwen-step.txt" 2>&1
    note "step profile :: $(head -1 "$work/profile-qwen-step.txt")"
  fi
fi

grep -h "test result" "$work"/*.log >> "$work/summary.txt" 2>/dev/null
tar czf "$out/suite-$part.tgz" -C "$(dirname "$work")" suite
cat "$work/gpu.txt" "$work/summary.txt"
