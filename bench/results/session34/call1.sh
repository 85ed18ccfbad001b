export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 bench/results/session34/parts2.py > $OUT/p.txt 2>&1; cat $OUT/p.txt | cut -c1-300 | tail -45
bash .gpu/g/f.sh 2>&1 | tail -12
