"""Distillation of draft models: data windows, the draft's config, and the training loop."""
