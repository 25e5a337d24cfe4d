"""Offline data: what the target writes once and every later run reads.

regenerate.py       the target's own continuations of the corpus (training data in the target's distribution),
                    split over workers and resumable shard by shard
shards.py           the shard cache those writers share: names, locks, manifests, what is missing
feature_cache.py    the target's features of every training row captured once (`python -m dmtp.prepare`)
feature_codecs.py   how cached hidden states are stored (float, int8 per row, a fitted low-rank basis)
feature_spec.py     what a cache holds, and the one name it is found under
"""
