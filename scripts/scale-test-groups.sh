#!/usr/bin/env bash
# Writes OUT, a copy of the nextest config IN (.config/nextest.toml) with its
# test groups scaled for a host of GPUS GPUs:
#
#   scripts/scale-test-groups.sh GPUS IN OUT
#
# One GPU: a plain copy. Several: a `gpu` slot for every GPU, and the
# trials that need one GPU alone on one thread each (the override line
# marked `# one GPU alone`), so each times its own GPU while the others time
# theirs. `gpu-shared` keeps its dozen slots, spread over the GPUs: the
# driver creates contexts one process at a time across the whole host, and
# 32 shared trials at once on four H100s took four times the setup of 12
# (docs/src/performance/suite-time.md). Fails, writing nothing usable, when
# IN's lines are not the ones this script rewrites.
set -euo pipefail
gpus=${1:?usage: scripts/scale-test-groups.sh GPUS IN OUT}
in=${2:?usage: scripts/scale-test-groups.sh GPUS IN OUT}
out=${3:?usage: scripts/scale-test-groups.sh GPUS IN OUT}
if [ "$gpus" -le 1 ]; then
  cp "$in" "$out"
  exit 0
fi
sed -e "s/^gpu = { max-threads = 1 }/gpu = { max-threads = $gpus }/" \
  -e "s/^threads-required = 'num-test-threads' # one GPU alone$/threads-required = 1/" \
  "$in" > "$out"
grep -q "^gpu = { max-threads = $gpus }$" "$out" \
  && grep -q "^threads-required = 1$" "$out" || {
  echo "scripts/scale-test-groups.sh: $in's test groups are not the ones this script scales" >&2
  exit 2
}
