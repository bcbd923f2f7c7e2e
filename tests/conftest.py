"""Test setup: without CUDA, Triton kernels run through Triton's CPU interpreter.

TRITON_INTERPRET must be set before triton is first imported, hence here, at collection time.
"""

import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
