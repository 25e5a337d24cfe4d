#!/bin/bash
# Decode the quick start's drafter on the assistant target in every sampled mode (1 seed).
D=$1; OUT=$2; mkdir -p $OUT
export OMP_NUM_THREADS=1 DMTP_HOME=${DMTP_HOME:-$HOME/.cache/dmtp}
run() { name=$1; shift; python -m dmtp.infer target=assistant drafter=$D threads=1 "methods=[ar,mtp415,mtp:7,drafter]" progress=false "$@" hydra.run.dir=$OUT/$name > $OUT/$name.log 2>&1; }
run greedy
run t1_target_only temperature=1 verification=target_only
run t1_rej_sample temperature=1 verification=rejection
run t1_rej_block_argmax temperature=1 verification=rejection draft_rule.block=argmax
run t1_rej_all_argmax temperature=1 verification=rejection draft_rule.block=argmax draft_rule.mtp=argmax
run t1_blockv_block_argmax temperature=1 verification=block draft_rule.block=argmax
run t1_blockv_sample temperature=1 verification=block
run t06_rej_sample temperature=0.6 verification=rejection
run t06_rej_block_argmax temperature=0.6 verification=rejection draft_rule.block=argmax
echo done > $OUT/DONE
