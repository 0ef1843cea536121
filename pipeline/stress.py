"""`python -m pipeline.stress`: pipeline/tools/stress.py, run as a module of its own."""
import sys

from .tools.stress import main

if __name__ == "__main__":
    sys.exit(main())
