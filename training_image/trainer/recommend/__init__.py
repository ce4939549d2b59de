"""Two-tower retrieval (``--task recommend``): interactions in, a user tower and an item tower
trained with in-batch negatives and a logQ correction, recall@K, NDCG@K and MRR against the full
item set, and both towers with the item embeddings out as safetensors.

Modules: :mod:`.data` (``prepare-data --format interactions``, the id maps, the time split, the
batches), :mod:`.model` (the towers, their pooling and the loss), :mod:`.metrics` (the ranking
figures), :mod:`.task` (what the loop calls), :mod:`.evaluate` (``trn-train eval`` and
``predict``), :mod:`.export` (the safetensors directory) and :mod:`.sharding` (embedding tables
split row-wise across ranks).
"""

__all__: list[str] = []
