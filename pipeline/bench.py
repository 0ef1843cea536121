"""`python -m pipeline.bench`: pipeline/tools/bench.py, run as a module of its own."""
import sys

from .tools.bench import main

if __name__ == "__main__":
    sys.exit(main())
