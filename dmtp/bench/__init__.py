"""What the benchmark scripts in tools/ share: random drafters sized like published ones, transformers'
own generate() as the baseline, and the options every script takes (device, dtype, threads, output)."""
