import sys

from bench.dispatch import run

sys.exit(run("drafters", sys.argv[1:]))
