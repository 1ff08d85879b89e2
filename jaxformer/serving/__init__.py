"""Serving: the engine (continuous batching over a paged KV cache, on the families' one forward).

``Engine(model, num_blocks, block_size, max_num_seqs)``: ``add_request(prompt_ids, SamplingParams(...))`` queues a
request, ``step()`` advances every running one and returns their new tokens (``RequestOutput``). The cache is a
``PagedKVCache`` (``paged.py``), read and written by the model's own cached ``step``.
"""

from jaxformer.serving.engine import Engine, RequestOutput, SamplingParams, paging_problem
from jaxformer.serving.paged import BlockManager, PagedKVCache

__all__ = ["BlockManager", "Engine", "PagedKVCache", "RequestOutput", "SamplingParams", "paging_problem"]
