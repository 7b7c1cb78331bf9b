"""The fused token log-prob path: every log-prob and entropy in tepo goes through here.

`token_logprobs(hidden, weight, targets, temperature, with_entropy, chunk_size, backend)` never
materialises the [tokens x vocab] logits (docs/objectives.md §3). Back-ends: `torch` (chunked.py),
`triton` (triton_logprobs.py, CUDA), `naive` (naive.py, tests and benchmarks only).
`token_entropy_terms` (entropy_terms.py): the per-token terms of the first-order entropy
change, for TEPO's `first_order` KL mask.
"""

from tepo_cli.kernels.dispatch import BACKENDS, available_backends, token_logprobs
from tepo_cli.kernels.entropy_terms import token_entropy_terms

__all__ = ["BACKENDS", "available_backends", "token_entropy_terms", "token_logprobs"]
