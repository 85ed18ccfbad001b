import sys

import torch

a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
bad = [k for k in a if not torch.equal(a[k], b[k])]
print(f"{len(a)} outputs compared, {len(bad)} differ: {bad}")
