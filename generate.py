"""python generate.py --ckpt runs/tiny/ckpt.pt --prompt "It is a truth" --max-new-tokens 200 (see kernel_dispatch.generate)."""
import sys

from kernel_dispatch.generate import main

if __name__ == "__main__":
    sys.exit(main())
