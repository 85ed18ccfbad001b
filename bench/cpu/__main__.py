import sys

from bench.dispatch import run

sys.exit(run("cpu", sys.argv[1:]))
