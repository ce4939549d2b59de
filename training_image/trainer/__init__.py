"""The bundled trainer: a GPT-style decoder trained on Neuron, CUDA, CPU or (legacy) XLA.

Importing the package imports nothing heavy (torch is imported by the modules that need it) and
sets nothing: no environment variable, so that a program that imports it, and every process it
starts, runs as it would without it. It once set ``THP_MEM_ALLOC_ENABLE=1``, torch's switch for
huge pages on every CPU allocation of 2 MiB or more; that cost CPU training 14% of its speed
(issue 36, docs/performance.md).
"""

__all__: list[str] = []
