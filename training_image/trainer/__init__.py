"""The bundled trainer: a GPT-style decoder trained on Neuron, CUDA, CPU or (legacy) XLA.

Importing the package imports nothing heavy; torch is imported by the modules that need it.
"""

import os

# Large CPU tensors on transparent huge pages: torch's CPU allocator (c10) advises them when this
# is 1, read once at its first allocation, so it is set here, before any module imports torch.
# Writing fresh memory (loading a checkpoint into new FP32 parameters) then faults 2 MiB pages
# instead of 4 KiB ones: 620 MB first written in ~0.14 s instead of 0.4-0.8 s on the bench's
# CPU. A value already set (0 to opt out) is kept.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

__all__: list[str] = []
