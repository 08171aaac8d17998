"""Runnable examples; ``python -m serverless_gpu.examples.mlp`` is the README's main job."""
