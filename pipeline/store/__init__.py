"""What a run leaves on disk: Zarr arrays, task outputs (manifests, locks), the resumable chunk
writer, fault points for crash tests and timing. Knows no model and no Luigi."""
