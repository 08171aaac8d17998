"""The launcher process: one per caller, forks the ranks and supervises them (``python -m
serverless_gpu.launcher_process``). Imports the rank code it forks; never the caller's."""
