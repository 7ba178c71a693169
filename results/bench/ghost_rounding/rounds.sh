cd /work/main
for r in $(seq 1 20); do
  for v in old new; do
    src=/tmp/old/src; [ $v = new ] && src=/work/main/src
    for cfg in "resnet20 materialize 0" "resnet20 auto 1073741824" "resnet20 ghost 0"; do
      t=$(OMP_NUM_THREADS=1 .venv/bin/python /tmp/bench_ghost.py $src $cfg)
      echo "$r $v $cfg $t"
    done
  done
done
