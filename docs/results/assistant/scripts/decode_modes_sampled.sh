#!/bin/bash
D=$1; OUT=$2
export OMP_NUM_THREADS=1 DMTP_HOME=${DMTP_HOME:-$HOME/.cache/dmtp}
mkdir -p $OUT
run() { name=$1; shift; python -m dmtp.infer target=assistant drafter=$D threads=1 "methods=[drafter]" progress=false "$@" hydra.run.dir=$OUT/$name > $OUT/$name.log 2>&1; }
run greedy
run t1_target_only temperature=1 verification=target_only
run t1_rej_sample temperature=1 verification=rejection
run t1_rej_mtp_argmax temperature=1 verification=rejection draft_rule.mtp=argmax
run t1_blockv_sample temperature=1 verification=block
run t06_rej_sample temperature=0.6 verification=rejection
echo done > $OUT/DONE
