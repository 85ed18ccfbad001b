import sys

from bench.dispatch import run

sys.exit(run("profile", sys.argv[1:]))
