"""Train the small lazy-attention + mHC byte-level language model.

    python train.py --config configs/tiny.yaml [--resume [PATH]] [--compile | --cuda-graph] [--section.key=value ...]
    torchrun --nproc_per_node=2 train.py --config configs/gpu-ddp.yaml

Overrides set any config key, e.g. --train.max_steps=50 --model.dim=128 --backend=golden
(values are YAML scalars; an unknown key is an error naming it). Backend choice, strongest first:
LAZYATTN_BACKEND / MHC_BACKEND / KERNEL_BACKEND, then the config's backend: key, then auto.
"""
import argparse
import sys

from kernel_dispatch.config import ConfigError, check_environment
from kernel_dispatch.training.config import load_run_config
from kernel_dispatch.training.loop import train


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--config", help="YAML run config (default: the built-in defaults, the model and "
                                         "schedule of configs/tiny.yaml)")
    parser.add_argument("--resume", nargs="?", const="auto", metavar="PATH",
                        help="continue from a checkpoint file or directory (default: <train.out_dir>/ckpt.pt)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (= --train.compile=true)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="capture each step's forward+backward in a CUDA graph (= --train.cuda_graph=true)")
    args, overrides = parser.parse_known_args(argv)
    try:
        check_environment()
        cfg = load_run_config(args.config, overrides + (["--train.compile=true"] if args.compile else [])
                               + (["--train.cuda_graph=true"] if args.cuda_graph else []))
        train(cfg, resume=args.resume, config_name=args.config or "defaults")
    except ConfigError as e:
        parser.exit(2, f"train.py: error: {e}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
