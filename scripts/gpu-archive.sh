#!/usr/bin/env bash
# Build the GPU suite once, here, for a GPU runner that has no Rust toolchain
# (docs/src/guide/gpu-runners.md):
#
#   scripts/gpu-archive.sh     # -> .gpu/falsify.tar.zst and .gpu/cargo-nextest
#
# The archive is cargo-nextest's (`cargo nextest archive`, release profile)
# and holds the test executables the GPU run needs — the contract suite, the
# GPU-only integration tests and the `falsify` CLI they start — not the
# CPU-only tests. `.gpu/` is git-ignored; carry it to the runner, where a
# checkout of the same commit provides contracts/ and .config/nextest.toml:
#
#   .gpu/cargo-nextest nextest run --archive-file .gpu/falsify.tar.zst \
#     --workspace-remap . --profile ci
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .gpu
nextest=$(command -v cargo-nextest) || {
  echo "cargo-nextest is not installed: cargo install --locked cargo-nextest" >&2
  exit 2
}
rm -f .gpu/falsify.tar.zst
# Cargo fingerprints workspace members by paths relative to the workspace
# root, so a second checkout (a git worktree) built into the same target
# directory leaves artifacts this checkout takes as fresh. Rebuilding the
# workspace crates the archive holds (the stack, the harness core, the qlora
# subject and the front ends) makes it this checkout's code, whatever else
# shares the target directory.
cargo clean --release -p qlora -p falsify-core -p falsify-qlora -p falsify
cargo nextest archive --release --archive-format tar-zst --archive-file .gpu/falsify.tar.zst \
  -p falsify --test contracts --test gpu_fault_isolation \
  -p qlora --test train_gpu --test fault_scope --test nvrtc
cp "$nextest" .gpu/cargo-nextest
# The device tool carries at most 64 MiB of working tree in all.
du -sh .gpu/falsify.tar.zst .gpu/cargo-nextest
du -sm .gpu | awk '{print "carry size:", $1, "MiB (limit 64 MiB for the whole working tree)"}'
