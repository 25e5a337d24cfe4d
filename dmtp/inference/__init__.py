"""The decoding application (`python -m dmtp.infer`) over the engine in dmtp.decode: the one setup
loader of every decoding run (setup), which drafter decodes (drafters), options, prompt sets, running
decoders over workloads (workloads) and the comparison itself (compare)."""
