"""One measurement: ``python bench_ghost.py SRC MODEL STRATEGY KEEP_BYTES`` prints the best
of 3 ``GhostClipper.clipped_sum`` calls (s) of the dpsub source tree SRC, one thread."""

import sys
import time

sys.path.insert(0, sys.argv[1])  # the code under test: before or after the fix

import torch  # noqa: E402

from dpsub.grads.ghost import GhostClipper  # noqa: E402
from dpsub.models import build_model  # noqa: E402

torch.set_num_threads(1)
name, strategy, keep = sys.argv[2], sys.argv[3], int(sys.argv[4])
shape = (3, 32, 32) if name != "mnist_cnn" else (1, 28, 28)
torch.manual_seed(0)
model = build_model(name, shape, 10)
x, y = torch.randn(32, *shape), torch.randint(0, 10, (32,))
clip = GhostClipper(model, strategy=strategy, keep_bytes=keep)
clip.clipped_sum(x, y, 1.0)  # warm-up
best = []
for _ in range(3):
    t0 = time.perf_counter()
    clip.clipped_sum(x, y, 1.0)
    best.append(time.perf_counter() - t0)
print(min(best))
