"""`python -m sglang.launch_server ...`: the replica's entry point (sglang/launch_server.py in 0.5.23)."""

import sys

from sglang._replica import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
