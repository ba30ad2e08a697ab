#!/usr/bin/env bash
# The whole GPU run, executed on the GPU machine from a checkout of this
# commit with the cargo-nextest archive in .gpu/ (docs/src/guide/gpu-runners.md):
#
#   scripts/gpu-suite.sh OUTDIR [all|suite|peers|sanitizers|benches] [hash:K/N]
#
# Build first, here: `scripts/gpu-archive.sh` (the archive and the
# cargo-nextest binary), and for part `benches` also
# `../shared/gpu/stage --benches` (criterion executables in .gpu/bin).
#
# Part `suite` (one whole-suite run from the archive took 291 s on one H200,
# 370 s on one H100 and 243 s on two H200s at commit c0d8c57; with one GPU
# the two runs of this part need two 10-minute device calls, or one shard each):
# 1. the contract suite through cargo-nextest, twice, one process per trial,
#    cuda trials that need a GPU alone one at a time on one GPU (the `gpu`
#    test group; on a host of several, one per GPU, those that need the
#    whole host alone on it), the others a dozen at a time, spread over the
#    GPUs (`gpu-shared`); with hash:K/N, only that
#    shard (merge the shards' reports with `falsify report --merge`);
#    scripts/compare-verdicts.py says whether the two runs gave the same verdicts;
# 2. the GPU-only integration tests (fault isolation, out of memory, training
#    step, NVRTC), one GPU at a time.
#    The six trials of peer-pytorch-v1 are left out of this part: each
#    starts the PyTorch peer, whose torch.compile takes 20 to 130 s.
# Part `peers` (one invocation took 372 s on one H200 and 449 s on one H100):
# 2b. the peer-pytorch-v1 trials, one at a time (each needs the GPU alone),
#    with PyTorch on the machine; skipped with the reason where it is not.
# Part `sanitizers`:
# 3. compute-sanitizer memcheck, initcheck and racecheck over the cuda
#    op-parity trials.
# Part `benches`:
# 4. the criterion benches (kernels, training step);
# 5. when .gpu/bin/step_profile is there (examples/step_profile.rs), one
#    qwen2.5-0.5b step timed per mode and profiled kernel by kernel with ncu.
# `all` (the default) runs every part; the device tool's 10-minute limit per
# call may need the parts in separate calls. Everything is packed into
# OUTDIR/suite-PART.tgz (the device tool returns at most 8 files), with the
# JUnit files; a short summary is printed last.
set -uo pipefail
out=${1:?usage: scripts/gpu-suite.sh OUTDIR [all|suite|sanitizers|benches] [hash:K/N]}
part=${2:-all}
shard=${3:-}
case "$part" in
  all|suite|peers|sanitizers|benches) ;;
  *) echo "unknown part '$part': all, suite, peers, sanitizers or benches" >&2; exit 2 ;;
esac
runs() { [ "$part" = all ] || [ "$part" = "$1" ]; }
bin=.gpu/bin
work=$(mktemp -d)/suite
mkdir -p "$work"
note() { echo "$*" >> "$work/summary.txt"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu \
  --format=csv > "$work/gpu.txt" 2>&1

# The archive, extracted into .gpu/extracted (its target/ holds the
# executables; nextest writes JUnit to target/nextest/ci/ of this tree).
extracted=.gpu/extracted
mkdir -p "$extracted"
nextest() {
  .gpu/cargo-nextest nextest "$1" --archive-file .gpu/falsify.tar.zst --workspace-remap . \
    --extract-to "$extracted" --extract-overwrite "${@:2}"
}
# The test groups scaled for this host's GPUs (one GPU: as committed);
# scripts/scale-test-groups.sh says how.
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "${gpus:-0}" -ge 1 ] || gpus=1
scripts/scale-test-groups.sh "$gpus" .config/nextest.toml .gpu/nextest.toml || exit 2
note "GPUs: $gpus (test groups: $(grep -E '^gpu(-shared|-ranks)? = ' .gpu/nextest.toml | tr '\n' ' '))"
partition=()
[ -n "$shard" ] && partition=(--partition "$shard")
junit() { cp target/nextest/ci/junit.xml "$work/junit-$1.xml" 2>/dev/null; }

if runs suite; then
  for run in 1 2; do
    rm -rf reports/latest
    nextest run --profile ci --config-file .gpu/nextest.toml "${partition[@]}" \
      -E 'binary(contracts) & !test(/peer-pytorch-v1/)' > "$work/run$run.log" 2>&1
    note "run$run exit $?"
    junit "run$run"
    if [ "$run" = 1 ]; then
      cp reports/latest/falsification.csv reports/latest/speedups.csv reports/latest/run.json "$work/"
    else
      cp reports/latest/falsification.csv "$work/falsification-rerun.csv"
    fi
  done
  note "rerun :: $(python3 scripts/compare-verdicts.py "$work/falsification.csv" "$work/falsification-rerun.csv")"

  # Not in the shard: these run once per host, on device 0, one at a time.
  nextest run --profile ci --run-ignored all \
    -E 'binary(gpu_fault_isolation) | binary(train_gpu) | binary(fault_scope) | binary(nvrtc)' \
    > "$work/gpu-tests.log" 2>&1
  note "GPU-only tests exit $?"
  junit gpu-tests
fi

if runs peers; then
  rm -rf reports/latest
  nextest run --profile ci -E 'binary(contracts) & test(/peer-pytorch-v1::/)' > "$work/peers.log" 2>&1
  note "peers exit $? (a falsified peer claim fails its test)"
  junit peers
  for f in falsification speedups; do
    cp "reports/latest/$f.csv" "$work/peers-$f.csv" 2>/dev/null
  done
fi

if runs sanitizers; then
  nextest list -E 'binary(contracts)' > /dev/null 2>&1
  contracts=$(find "$extracted/target" -path '*/deps/contracts-*' -type f -perm -u+x | head -1)
  for tool in memcheck initcheck racecheck; do
    timeout 200 compute-sanitizer --tool "$tool" --print-limit 20 \
      "$contracts" --test-threads 1 --skip ::mutant kernel-parity > "$work/sanitizer-$tool.log" 2>&1
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

grep -h -E "test result|Summary \[" "$work"/*.log >> "$work/summary.txt" 2>/dev/null
tar czf "$out/suite-$part.tgz" -C "$(dirname "$work")" suite
cat "$work/gpu.txt" "$work/summary.txt"
