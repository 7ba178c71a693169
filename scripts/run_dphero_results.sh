#!/usr/bin/env bash
# The CPU runs behind results/dphero/README.md (no GPU was lent to this issue).
#   scripts/run_dphero_results.sh hero    # DP-Hero, its floor variant, DP-SGD at sigma 1, 3, 5
#   scripts/run_dphero_results.sh mia     # non-private / DP-SGD / GEP models on MNIST + attacks
#   scripts/run_dphero_results.sh small   # the same attack where a model can memorize (N = 1000)
# Single-threaded runs, one after the other; run dirs in outputs/dphero/<name>.
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 DPSUB_DATA=${DPSUB_DATA:-../shared/data}
PY=${PY:-.venv/bin/python}
OUT=outputs/dphero
train() {  # train NAME OVERRIDES...
  local name=$1; shift
  [ -f "$OUT/$name/summary.json" ] && return 0
  $PY -m dpsub.cli.train logger.mode=disabled train.progress=false out_dir="$OUT/$name" "$@" \
    > "$OUT/$name.log" 2>&1
}
mkdir -p "$OUT"
case "${1:-}" in
  hero)
    for sigma in ${SIGMAS:-1 3 5}; do
      for mech in dphero dphero_floor dpsgd; do
        train "lenet_${mech}_sigma${sigma}" experiment=dphero_mnist_lenet \
          mechanism=$mech privacy.noise_multiplier=$sigma
      done
    done ;;
  mia)
    # GEP's MNIST setting (results/README.md: mnist_cnn, batch 1000, eps 2), reduced epochs
    train mia_nonprivate dataset=mnist model=mnist_cnn mechanism=nonprivate train.epochs=10 \
      train.batch_size=1000 optim.lr=0.1 optim.momentum=0.9 optim.weight_decay=1e-4 \
      "optim.schedule.milestones=[0.5]" run_name=mia-nonprivate
    train mia_dpsgd experiment=dpsgd_mnist_eps2 train.epochs=10 optim.lr=1.0 grads.backend=ghost
    # GEP: 3 epochs (a GEP step took ~10 s on the shared CPU); epsilon 2 calibrated for them
    train mia_gep experiment=gep_mnist_eps2 train.epochs=3 train.eval_every=60
    for run in "$OUT"/mia_* "$OUT"/lenet_*; do
      [ -f "$run/summary.json" ] && $PY scripts/mia.py "$run"
    done ;;
  small)
    # A 1,000-example private set learned by heart (non-private) vs DP-SGD at epsilon 2
    # (lr 0.01: at lr 0.1 with momentum 0.9 neither model trained, both at ~10%)
    small="dataset=mnist dataset.train_size=1000 model=mnist_cnn train.epochs=100 \
      train.batch_size=100 train.eval_every=200 optim.lr=0.01 optim.momentum=0.9"
    train mia_small_nonprivate $small mechanism=nonprivate run_name=mia-small-nonprivate
    train mia_small_dpsgd $small mechanism=dpsgd grads.backend=ghost run_name=mia-small-dpsgd
    for run in "$OUT"/mia_small_*/; do $PY scripts/mia.py "${run%/}"; done ;;
  *) echo "usage: $0 hero|mia|small" >&2; exit 2 ;;
esac
