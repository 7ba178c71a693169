#!/usr/bin/env bash
# Accuracy of GEP against the subspace cadence s (mechanism.subspace_every), with and
# without warm-started tracking, in a reduced PDP-SGD setting (see README.md here).
# One single-threaded lane, 48 runs: for each seed, for each dataset, one Hydra sweep
# over warm_start x s (8 runs), so an interrupted study still has whole seeds.
#   bash results/speed/run_study.sh            (from the repository root)
set -euo pipefail
cd "$(dirname "$0")/../.."
export DPSUB_DATA=${DPSUB_DATA:-/work/shared/data} OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
OUT=${OUT:-outputs/speed_study}
common=(experiment=gep_pdp_setting logger=disabled train.progress=false)
mkdir -p "$OUT"
for seed in 0 1 2; do
  for ds in mnist fashion_mnist; do
    .venv/bin/python -m dpsub.cli.train -m "dataset=$ds" "seed=$seed" "${common[@]}" \
      mechanism.warm_start=false,true mechanism.subspace_every=1,5,20,100 \
      "hydra.sweep.dir=$OUT/$ds/seed$seed" > "$OUT/${ds}_seed$seed.log" 2>&1
  done
done
