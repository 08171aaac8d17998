"""``python -m serverless_gpu.cli`` is the ``serverless-gpu`` command."""

from serverless_gpu.cli import main

if __name__ == "__main__":
    main()
