#!/usr/bin/env bash
# The CPU runs behind results/rgp/README.md (no GPU was lent to this issue): the reduced
# setting of conf/experiment/rgp_cifar10_cpu.yaml on CIFAR-10 (JPEG copy), two lanes of
# single-threaded runs. Usage: results/rgp/run_cpu.sh NAME [overrides...]   (one run)
# Each run writes outputs/rgp_cpu/NAME (config.yaml, metrics.jsonl, summary.json, train.log).
set -eu
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
name=$1; shift
exec .venv/bin/python -m dpsub.cli.train experiment=rgp_cifar10_cpu \
  data.root=${CIFAR10_ROOT:?set CIFAR10_ROOT to CIFAR-10 in torchvision layout} logger=disabled train.progress=false \
  out_dir=outputs/rgp_cpu/$name "$@" > /dev/null 2>&1
