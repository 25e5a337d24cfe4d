#!/bin/bash
# Runs 4..8 of the same bench (timing on a shared, loaded 2-core machine: keep the fastest run per method).
D=outputs/issue16
for i in 4 5 6 7 8; do
OMP_NUM_THREADS=1 python tools/bench_decode.py --no-hf --threads 1 --num-prompts 16 --max-new-tokens 64 --batch-size 4 \
 --drafter $D/dmtp_frozen/drafter \
 --drafter $D/multi_mtp/drafter@num_mtp_tokens=1 --drafter $D/multi_mtp/drafter@num_mtp_tokens=2 \
 --drafter $D/multi_mtp/drafter@num_mtp_tokens=3 --drafter $D/multi_mtp/drafter@mtp_threshold=0.3 \
 --drafter $D/multi_mtp/drafter@mtp_threshold=0.5 --drafter $D/multi_mtp/drafter@mtp_threshold=0.7 \
 --drafter $D/dmtp_joint/drafter --out $D/bench$i.json > $D/bench$i.txt 2>&1
uptime >> $D/bench_load.txt
done
