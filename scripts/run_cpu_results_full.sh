#!/usr/bin/env bash
# The GEP paper's MNIST eps=2 setting in full (50 epochs, 3000 steps) on the CPU:
# GEP and B-GEP in two single-threaded lanes, then DP-SGD. Logs in results/logs/.
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 DPSUB_DATA=${DPSUB_DATA:-../shared/data}
R="uv run --frozen dpsub-train logger.mode=offline train.progress=false"
$R experiment=gep_mnist_eps2 > results/logs/gep_mnist_eps2_50ep.log 2>&1 &
$R experiment=bgep_mnist_eps2 > results/logs/bgep_mnist_eps2_50ep.log 2>&1 &
wait
$R experiment=dpsgd_mnist_eps2 > results/logs/dpsgd_mnist_eps2_50ep_lr0.1.log 2>&1
grep -h "final:" results/logs/*50ep*.log
