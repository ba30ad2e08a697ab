#!/usr/bin/env bash
# The subjects outside the root workspace, on the GPU machine: the example
# subject (examples/subject-axpy) and aprender-train (subjects/aprender-train).
# Their release test executables are built here first and staged in
# .gpu/subjects/ (a GPU runner has no Rust toolchain):
#
#   scripts/gpu-subjects.sh stage          # here: build and copy the executables
#   scripts/gpu-subjects.sh run OUTDIR     # on the GPU machine, from the repo root
#   scripts/gpu-subjects.sh probe OUTDIR   # on the GPU machine: where aprender-train's step runs
#
# `run` starts each subject's contract suite from the subject's own folder
# (its harness reads ./contracts first and writes ./reports/latest), twice for
# aprender-train (a rerun must give the same verdicts), and packs the reports
# into OUTDIR/subjects.tgz.
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
stage=.gpu/subjects

newest_test() { # newest executable named contracts-* (or nvrtc-*) under $1
  find "$1" -maxdepth 1 -type f -perm -u+x -name "$2-*" -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2
}

case "${1:-}" in
  stage)
    set -e
    mkdir -p "$stage"
    cargo test --release --locked --no-run --manifest-path examples/subject-axpy/Cargo.toml --target-dir target/axpy --test contracts --test nvrtc
    cp "$(newest_test target/axpy/release/deps contracts)" "$stage/axpy-contracts"
    cp "$(newest_test target/axpy/release/deps nvrtc)" "$stage/axpy-nvrtc"
    cargo test --release --locked --no-run --manifest-path subjects/aprender-train/Cargo.toml --test contracts
    cp "$(newest_test subjects/aprender-train/target/release/deps contracts)" "$stage/aprender-contracts"
    cargo build --release --locked --manifest-path subjects/aprender-train/Cargo.toml --example probe
    cp subjects/aprender-train/target/release/examples/probe "$stage/aprender-probe"
    strip "$stage"/* 2>/dev/null || true
    du -sh "$stage"/*
    ;;
  run)
    out=${2:?usage: scripts/gpu-subjects.sh run OUTDIR}
    work=$(mktemp -d)/subjects
    mkdir -p "$work"
    root=$(pwd)
    (cd examples/subject-axpy && rm -rf reports/latest &&
      "$root/$stage/axpy-nvrtc" --include-ignored > "$work/axpy-nvrtc.log" 2>&1
      echo "axpy nvrtc exit $?" >> "$work/summary.txt"
      "$root/$stage/axpy-contracts" --test-threads 1 > "$work/axpy.log" 2>&1
      echo "axpy contracts exit $?" >> "$work/summary.txt"
      cp -r reports/latest "$work/axpy")
    for run in 1 2; do
      (cd subjects/aprender-train && rm -rf reports/latest &&
        "$root/$stage/aprender-contracts" --test-threads 1 > "$work/aprender-run$run.log" 2>&1
        echo "aprender-train run$run exit $?" >> "$work/summary.txt"
        cp -r reports/latest "$work/aprender-run$run")
    done
    python3 scripts/compare-verdicts.py "$work/aprender-run1/falsification.csv" \
      "$work/aprender-run2/falsification.csv" >> "$work/summary.txt" 2>&1
    grep -h "test result" "$work"/*.log >> "$work/summary.txt"
    tar czf "$out/subjects.tgz" -C "$(dirname "$work")" subjects
    cat "$work/summary.txt"
    ;;
  probe)
    # aprender-train's un-graphed step over batch x sequence length, three
    # steps each on a cold module cache (a fresh HOME), three times per shape
    # (the failure is not deterministic), then one step under compute-sanitizer
    # memcheck at a shape that fails outside it. The pipeline exits 0 even
    # when a step fell back to the CPU, so each line also counts the stderr's
    # CPU fall-backs and CUDA_ERROR_ILLEGAL_ADDRESS (700) reports. Packed into
    # OUTDIR/probe.tgz.
    out=${2:?usage: scripts/gpu-subjects.sh probe OUTDIR}
    work=$(mktemp -d)/probe
    mkdir -p "$work"
    probe=$(pwd)/$stage/aprender-probe
    failures() { # the CPU fall-backs and illegal-address reports in a stderr log
      echo "cpu_fallbacks=$(grep -c 'falling back to CPU' "$1") illegal_address=$(grep -c 'ILLEGAL_ADDRESS' "$1")"
    }
    for shape in "1 256" "4 256" "2 256" "1 128" "4 128" "1 64" "4 64" "4 32"; do
      read -r b s <<< "$shape"
      for rep in 1 2 3; do
        log="$work/batch$b-seq$s-run$rep"
        start=$(date +%s)
        HOME=$(mktemp -d) timeout 60 "$probe" qwen2-tiny-4l 3 --batch "$b" --seq-len "$s" --last 2 \
          > "$log.out" 2> "$log.err"
        echo "batch $b seq_len $s run $rep: exit $? in $(( $(date +%s) - start )) s;" \
          "$(failures "$log.err");" \
          "$(grep -h '^step=\|^error=' "$log.out" | tr '\n' ' ')" >> "$work/summary.txt"
      done
    done
    HOME=$(mktemp -d) timeout 200 compute-sanitizer --tool memcheck --print-limit 10 \
      "$probe" qwen2-tiny-4l 1 --batch 4 --seq-len 256 --last 1 > "$work/memcheck.out" 2> "$work/memcheck.err"
    echo "memcheck batch 4 seq_len 256: exit $?; $(failures "$work/memcheck.err");" \
      "$(grep -h 'ERROR SUMMARY' "$work/memcheck.out")" >> "$work/summary.txt"
    tar czf "$out/probe.tgz" -C "$(dirname "$work")" probe
    cat "$work/summary.txt"
    ;;
  *)
    echo "usage: scripts/gpu-subjects.sh stage | run OUTDIR | probe OUTDIR" >&2
    exit 2
    ;;
esac
