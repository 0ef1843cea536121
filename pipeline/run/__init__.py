"""What a run is before it computes: its spec and evaluation task, the sequence plan, the
layer placement and the preflight against memory and disk. Knows no Luigi."""
