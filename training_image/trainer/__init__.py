"""The bundled trainer: a GPT-style decoder trained on Neuron, CUDA, CPU or (legacy) XLA.

Importing the package imports nothing heavy; torch is imported by the modules that need it.
"""

__all__: list[str] = []
