"""`python -m pipeline.gpu_check`: pipeline/tools/gpu_check.py, run as a module of its own."""
import sys

from .tools.gpu_check import main

if __name__ == "__main__":
    sys.exit(main())
