import sys

from bench.dispatch import run

sys.exit(run("kernels", sys.argv[1:]))
