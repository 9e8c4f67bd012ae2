"""The Triton backend's one interpreter switch (no triton import, so the capability table can read it).

TRITON_INTERPRET=1 runs the kernels on the CPU through triton's interpreter; triton reads the variable when it is
first imported, and so does this module: every other module of the backend takes ``INTERPRET`` from here.
"""
import os

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
