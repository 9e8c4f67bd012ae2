"""Two CPU processes (gloo): DDP keeps the ranks' parameters identical; FSDP2 under torchrun trains the same.

Each rank reads its own shard of the data, so without gradient synchronisation the ranks'
parameters would drift apart after the first step.
"""
import gc
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kernel_dispatch.training import config as tcfg
from kernel_dispatch.training.data import ShardedSampler

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "model": {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "n_streams": 4, "max_bias_length": 32},
    "data": {"seq_len": 32},
    "train": {"batch_size": 2, "max_steps": 4, "eval_interval": 100, "eval_batches": 2, "warmup_steps": 2,
              "device": "cpu", "progress": False, "plot": False},
}

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    from kernel_dispatch.training import loop

    data = tcfg.apply_overrides(TINY, [("train.out_dir", out_dir), ("train.dist", "ddp")])
    gc.disable()  # cycles go only where the code collects them: the check below does not depend on GC timing
    result = loop.train(tcfg.from_mapping(data, "test"))
    gc.enable()
    # the DDP wrapper (in a reference cycle; its reducer holds the process group's backend) is freed before the
    # group is destroyed, not at interpreter exit (where its threads could abort the process)
    leftover = [o for o in gc.get_objects() if isinstance(o, torch.nn.parallel.DistributedDataParallel)]
    assert not leftover, f"rank {rank}: {len(leftover)} DistributedDataParallel wrapper(s) outlive the run"
    torch.save({"params": result.model.state_dict(), "history": result.history}, Path(out_dir) / f"rank{rank}.pt")


def test_ddp_ranks_hold_identical_parameters(tmp_path):
    mp.spawn(_ddp_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2))
    assert r0["history"]["train"] == r1["history"]["train"]  # the logged loss is the mean over ranks
    fresh = torch.load(tmp_path / "ckpt.pt", weights_only=True)["model"]
    moved = 0
    for name, p0 in r0["params"].items():
        assert torch.equal(p0, r1["params"][name]), f"{name} differs between ranks"
        assert torch.equal(p0, fresh[name]), f"{name}: the checkpoint differs from rank 0"
        moved += 1
    assert moved > 0


def test_fsdp2_under_torchrun_logs_once_and_matches_ddp(tmp_path):
    """torchrun --nproc_per_node=2 train.py with dist: fsdp2; compared with the DDP run of the same data."""
    pytest.importorskip("torch.distributed.fsdp", reason="no torch.distributed.fsdp")
    from torch.distributed import fsdp

    if not hasattr(fsdp, "fully_shard"):
        pytest.skip(f"torch {torch.__version__} has no FSDP2 fully_shard")
    overrides = [f"--{s}.{k}={v}" for s, sec in TINY.items() for k, v in sec.items()]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for var in ("LAZYATTN_BACKEND", "MHC_BACKEND", "KERNEL_BACKEND"):
        env.pop(var, None)
    runs = {}
    for strategy in ("fsdp2", "ddp"):
        out = tmp_path / strategy
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
               f"--master_port={_free_port()}", "train.py", *overrides, f"--train.dist={strategy}",
               f"--train.out_dir={out}"]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert proc.stdout.count("backends: lazy_attention=golden") == 1, proc.stdout  # rank 0 only
        assert f"2 ranks ({strategy.upper()})" in proc.stdout
        runs[strategy] = torch.load(out / "ckpt.pt", weights_only=True)
    fsdp_losses = [loss for _, loss in runs["fsdp2"]["history"]["train"]]
    ddp_losses = [loss for _, loss in runs["ddp"]["history"]["train"]]
    assert fsdp_losses == pytest.approx(ddp_losses, rel=1e-5)
    for name, p in runs["ddp"]["model"].items():
        torch.testing.assert_close(runs["fsdp2"]["model"][name], p, rtol=1e-4, atol=1e-6, msg=name)


def test_each_rank_reads_its_own_shard():
    data = torch.arange(10_000)  # every token is its own position
    cfg = tcfg.RunConfig()
    a, b = (ShardedSampler(data, 32, 4, cfg.train.seed, rank=r, world=2) for r in range(2))
    seen = [set(), set()]
    for _ in range(20):
        for r, s in enumerate((a, b)):
            x, _ = s.next_batch()
            seen[r].update(x[:, 0].tolist())
    assert not seen[0] & seen[1]
