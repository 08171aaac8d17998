"""``python -m serverless_gpu.cli`` is the ``serverless-gpu`` command."""

from . import main

if __name__ == "__main__":
    main()
