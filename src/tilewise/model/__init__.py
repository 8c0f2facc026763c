"""tilewise.model: the LFM2 classifier (config, checkpoints, float64 reference, runtime, executors, its dispatch,
tuning and bench).

Public entry point: `tilewise.load(path_or_preset, device="auto", weights="nf4", seed=0)`, which returns a
`tilewise.model.runtime.Model` with `prefill`, `extend`, `hidden` and `scores`.
"""
