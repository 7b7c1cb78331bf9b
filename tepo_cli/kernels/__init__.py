"""The fused token log-prob path: every log-prob and entropy in tepo goes through here.

`token_logprobs(hidden, weight, targets, temperature, with_entropy, chunk_size, backend)` never
materialises the [tokens x vocab] logits (ALGORITHMS.md §3). Back-ends: `torch` (chunked.py),
`triton` (triton_logprobs.py, CUDA), `naive` (naive.py, tests and benchmarks only).
"""

from tepo_cli.kernels.dispatch import BACKENDS, available_backends, token_logprobs

__all__ = ["BACKENDS", "available_backends", "token_logprobs"]
