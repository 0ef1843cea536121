"""The model math: architectures, the layer-window executor, its weight block, the scoring head
and KL-divergence, and the settings of a process that computes. Knows neither Luigi nor Zarr."""
