#!/usr/bin/env bash
# tools/checkpoint_info on real checkpoints of tinylm: a complete one (its step, world size, notes),
# verified; the same with a flipped data byte (found only by --verify, exit 1); a directory a save
# did not finish (shards, no index) with another host's live claim and a killed writer's temporary;
# a missing shard file (found without --verify); a claim of a dead process; a directory of
# --save-every's checkpoints (named); usage errors.
#   checkpoint_info_check.sh CHECKPOINT_INFO TINYLM
set -u
info=$1 tinylm=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
expect() {  # expect RC TEXT -- ARGS...: runs checkpoint_info ARGS, checks its exit status and output
  local rc=$1 text=$2
  shift 3
  out=$("$info" "$@" 2>&1)
  got=$?
  [ "$got" = "$rc" ] || fail "checkpoint_info $*: exit $got, wanted $rc: $out"
  grep -qF -- "$text" <<< "$out" || fail "checkpoint_info $*: no '$text' in: $out"
}

"$tinylm" -np 2 --steps 1 --seed 5 --save-checkpoint "$tmp/good" > "$tmp/train.log" 2>&1 ||
  { cat "$tmp/train.log"; fail "tinylm could not save"; }
expect 0 "complete: step 1, saved by 2 ranks, bf16" -- "$tmp/good"
expect 0 "tinylm.seed=5" -- "$tmp/good"
expect 0 "verified: every shard file read" -- --verify "$tmp/good"

cp -r "$tmp/good" "$tmp/flipped"
shard="$tmp/flipped/rank-1-of-2.shard"
size=$(stat -c %s "$shard")
printf '\xff' | dd of="$shard" bs=1 seek=$((size - 5)) conv=notrunc status=none
expect 0 "complete: step 1" -- "$tmp/flipped"  # the index alone is fine
expect 1 "verify FAILED" -- --verify "$tmp/flipped"

cp -r "$tmp/good" "$tmp/unfinished"
rm "$tmp/unfinished/index.txt"
touch "$tmp/unfinished/.rank-0-of-2.shard.tmp-123-0"
printf 'shardcomm-save-claim 1\ntag 0x0badf00d\npid 999999999\nhost elsewhere\nboot 0-not-this-one\nsince 1700000000\n' \
  > "$tmp/unfinished/.save-claim"
expect 1 "not a complete checkpoint: no index.txt (2 shard file(s) of a save that did not finish" -- "$tmp/unfinished"
expect 1 "host 'elsewhere'" -- "$tmp/unfinished"
expect 1 "1 temporary file(s) of killed writers" -- "$tmp/unfinished"
cp -r "$tmp/good" "$tmp/missing"
rm "$tmp/missing/rank-1-of-2.shard"
expect 1 "shard file rank-1-of-2.shard: No such file or directory: the checkpoint cannot be loaded" -- "$tmp/missing"
# A claim of this host whose holder is gone (a reaped child's pid).
sh -c 'exit 0' &
dead=$!
wait $dead
printf 'shardcomm-save-claim 1\ntag 0x0badf00d\npid %s\nhost %s\nboot %s\nsince 1700000000\n' "$dead" "$(hostname)" \
  "$(cat /proc/sys/kernel/random/boot_id)" > "$tmp/good/.save-claim"
expect 0 "save claim: left by a process that is gone (harmless beside a complete checkpoint" -- "$tmp/good"
expect 1 "no such directory" -- "$tmp/nothing"
# A directory of --save-every's checkpoints: not one itself, but they are named (it said only "no").
"$tinylm" --steps 7 --save-every 2 --save-checkpoint "$tmp/every" --vocab 32 --dim 8 --hidden 8 --layers 1 \
  --seq-len 4 > "$tmp/train.log" 2>&1 || { cat "$tmp/train.log"; fail "tinylm could not save every 2 steps"; }
expect 1 "holds 4 checkpoint directories: ..., step-00000004, step-00000006, step-00000007 (checkpoint_info $tmp/every/step-00000007)" -- "$tmp/every"
expect 2 "unknown option '--bogus'" -- --bogus "$tmp/good"
expect 2 "no checkpoint directory given" --
echo "PASS: checkpoint_info reports complete, corrupt and unfinished checkpoints"
