"""Kernel families: `space.py` (parameters and rules), `base.py` (the Problem / KernelTemplate protocol),
`registry.py` (family and backend -> implementation), and one package per family: `problem.py`, the math written
once, and one module per backend."""
