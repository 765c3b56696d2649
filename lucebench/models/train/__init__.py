"""Training of the reference models (issue 33): a small Qwen3.5 target, its DFlash draft and a Qwen3 drafter.

`pipeline.train_reference` runs every step; `python -m lucebench.models.train` and `lucebench models train`
call it. docs/models.md ("Trained reference models") describes the recipe and its measured quality.
"""
