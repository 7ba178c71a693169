#!/usr/bin/env bash
# The PDP-SGD study re-made with EQUAL grids (issue 27): per dataset, the tables
# conf/paper/pdpsgd-{mnist,fmnist}.yaml with --tune --skip-paper: every mechanism x sigma tuned
# on the same learning rates on a validation split (MNIST: 10 lrs, 120 runs, the grid extended
# to 10 after RPDP-SGD's best sat at 1.0; Fashion-MNIST: the same 10, 120 runs), then the picks at 3
# seeds on the test set (36 runs per dataset). One job at a time, niced, single-threaded (a
# shared 2-core machine). Two lanes may run at once (`--only mechanism=X --only sigma=Y`, one
# cell per lane): a finished job is skipped and a job locked by the other lane is left to it.
# Resumable: a finished run (under outputs/tables or committed under results/) is skipped or
# reused, so re-running this script continues where the last one stopped. After (or during)
# a run, copy the finished runs' small files and render the tables:
#   python scripts/make_table.py pdpsgd-mnist --out results/pdpsgd --no-projection
#   python scripts/make_table.py pdpsgd-fmnist --out results/pdpsgd --no-projection
set -u
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1 DPSUB_DATA="${DPSUB_DATA:-$(cd .. && pwd)/shared/data}"
PY="${PY:-.venv/bin/python}"
for ds in mnist fmnist; do
  nice -n 19 "$PY" scripts/reproduce.py "pdpsgd-$ds" --tune --skip-paper \
    logger=disabled train.progress=false
done
