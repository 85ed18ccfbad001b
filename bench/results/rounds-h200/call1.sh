# call 1: the c64 run traced by kind of round (before item 7), and c64_rounds for the unprofiled figure
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used --format=csv
python -m bench.trace_rounds --out $OUT/trace-before.json 2>&1 | grep -v Warning | tail -80
python -m bench.c64_rounds --runs 3 --seeded-runs 0 --out $OUT/c64-before.json 2>&1 | tail -5
