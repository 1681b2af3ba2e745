"""Env benchmarks: simulator steps/s and env-pool throughput (see mobilerl/env/bench.py; --help)."""

import sys

from mobilerl.env.bench import main

if __name__ == "__main__":
    sys.exit(main())
