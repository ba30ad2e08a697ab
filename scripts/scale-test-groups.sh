#!/usr/bin/env bash
# Writes OUT, a copy of the nextest config IN (.config/nextest.toml) with its
# test groups scaled for a host of GPUS GPUs:
#
#   scripts/scale-test-groups.sh GPUS IN OUT
#
# One GPU: a plain copy. Several: a `gpu` slot for every GPU, eight
# `gpu-shared` slots for every GPU, and the trials that need one GPU alone on
# one thread each (the override line marked `# one GPU alone`), so each
# times its own GPU while the others time theirs. Fails, writing nothing
# usable, when IN's lines are not the ones this script rewrites.
set -euo pipefail
gpus=${1:?usage: scripts/scale-test-groups.sh GPUS IN OUT}
in=${2:?usage: scripts/scale-test-groups.sh GPUS IN OUT}
out=${3:?usage: scripts/scale-test-groups.sh GPUS IN OUT}
if [ "$gpus" -le 1 ]; then
  cp "$in" "$out"
  exit 0
fi
sed -e "s/^gpu = { max-threads = 1 }/gpu = { max-threads = $gpus }/" \
  -e "s/^gpu-shared = { max-threads = 12 }/gpu-shared = { max-threads = $((8 * gpus)) }/" \
  -e "s/^threads-required = 'num-test-threads' # one GPU alone$/threads-required = 1/" \
  "$in" > "$out"
grep -q "^gpu = { max-threads = $gpus }$" "$out" \
  && grep -q "^gpu-shared = { max-threads = $((8 * gpus)) }$" "$out" \
  && grep -q "^threads-required = 1$" "$out" || {
  echo "scripts/scale-test-groups.sh: $in's test groups are not the ones this script scales" >&2
  exit 2
}
