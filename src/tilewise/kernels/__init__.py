"""Kernel families: one module per family (its Space, rules, reference, geometry, flop/byte counts) plus its sources."""
