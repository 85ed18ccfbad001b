export PYTHONUNBUFFERED=1
timeout 240 python3 bench/results/session33/parts.py > $OUT/p.txt 2>&1; grep '^{' $OUT/p.txt || tail -5 $OUT/p.txt
bash .gpu/g/f.sh 2>&1 | tail -12
