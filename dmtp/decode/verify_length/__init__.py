"""`verify_length=auto`: how many draft slots a round verifies.

policy.py   the per-round choice from the measured acceptance and costs
stats.py    the acceptance statistics it reads (P(L>=k) per slot, updated as rounds run)
costs.py    the measured cost of verifying each length
"""
