import sys

from bench.dispatch import run

sys.exit(run("speed", sys.argv[1:]))
