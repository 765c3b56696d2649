"""Models: named shapes, synthetic checkpoints, and resolving a model spec to a local folder."""
