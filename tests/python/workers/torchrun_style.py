"""A script written for torchrun, run unchanged under kolorun: it reads
torchrun's variables, calls init_process_group(backend="kolo") with the
default env:// rendezvous (argv[1] == "kolo": init_method="kolo://"),
trains a small DDP model 4 steps on its shard and checks that every rank
ends with the same parameters, equal to one process on the whole batch."""
import os
import sys

import torch
import torch.distributed as dist

import kolo.torch  # noqa: F401  (registers backend "kolo")

rank = int(os.environ["RANK"])
local_rank = int(os.environ["LOCAL_RANK"])
world = int(os.environ["WORLD_SIZE"])
print("ENV rank=%d local_rank=%d world=%d local_world=%s group_rank=%s master=%s:%s" % (
    rank, local_rank, world, os.environ["LOCAL_WORLD_SIZE"], os.environ["GROUP_RANK"],
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]), flush=True)
if len(sys.argv) > 1 and sys.argv[1] == "kolo":
    dist.init_process_group(backend="kolo", init_method="kolo://")
else:
    dist.init_process_group(backend="kolo")  # env:// (torch's default)
assert dist.get_rank() == rank and dist.get_world_size() == world
assert dist.get_backend() == "kolo", dist.get_backend()

t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
assert t.item() == world * (world + 1) / 2, t

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
torch.manual_seed(0)
ref = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1)
per = 4
for _ in range(4):
    x, y = torch.randn(per * world, 5, generator=g), torch.randn(per * world, 1, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(ddp(x[rank * per:(rank + 1) * per]),
                                 y[rank * per:(rank + 1) * per]).backward()
    opt.step()
    ropt.zero_grad()
    torch.nn.functional.mse_loss(ref(x), y).backward()
    ropt.step()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
outs = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(outs, flat)
assert all(torch.equal(o, flat) for o in outs), "ranks disagree"
diff = (flat - torch.cat([p.detach().reshape(-1) for p in ref.parameters()])).abs().max().item()
assert diff <= 1e-6, diff
dist.destroy_process_group()
print("TORCHRUN-OK rank %d diff %.3g" % (rank, diff), flush=True)
