#!/usr/bin/env bash
# The CPU runs behind README / results/*.md (no GPU was lent to these issues).
# Two lanes of single-threaded runs; each run's log goes to results/logs/.
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 DPSUB_DATA=${DPSUB_DATA:-../shared/data}
R="uv run --frozen dpsub-train logger.mode=offline train.progress=false"
# Reduced GEP-paper setting: 10 epochs instead of 50 (CPU time), everything else the paper's.
lane_a() {
  $R experiment=gep_mnist_eps2 train.epochs=10 > results/logs/gep_mnist_eps2_10ep.log 2>&1
  $R experiment=dpsgd_mnist_pdp_setting > results/logs/dpsgd_mnist_pdp_setting_lr0.2.log 2>&1
  $R experiment=dpsgd_mnist_pdp_setting optim.lr=1.0 > results/logs/dpsgd_mnist_pdp_setting_lr1.0.log 2>&1
}
lane_b() {
  $R experiment=bgep_mnist_eps2 train.epochs=10 > results/logs/bgep_mnist_eps2_10ep.log 2>&1
  $R experiment=dpsgd_mnist_eps2 train.epochs=10 > results/logs/dpsgd_mnist_eps2_10ep_lr0.1.log 2>&1
  $R experiment=dpsgd_mnist_eps2 train.epochs=10 optim.lr=1.0 > results/logs/dpsgd_mnist_eps2_10ep_lr1.0.log 2>&1
}
lane_a & lane_b & wait
grep -h "final:" results/logs/*.log
