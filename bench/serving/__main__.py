import sys

from bench.dispatch import run

sys.exit(run("serving", sys.argv[1:]))
