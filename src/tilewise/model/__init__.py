"""tilewise.model: the LFM2 classifier (config, NF4, checkpoints, float64 reference, runtime).

Public entry point: `tilewise.load(path_or_preset, device="cpu", weights="nf4", seed=0)`, which returns a
`tilewise.model.runtime.Model` with `prefill`, `extend`, `hidden` and `scores`.
"""
