"""The update's needed FLOPs and MFU (tepo_cli/train/flops.py), every number computed by hand."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tepo_cli.core.sequences import SequenceBatch
from tepo_cli.train import flops
from tepo_cli.train.flops import ModelShape, model_shape, update_work

ROOT = Path(__file__).resolve().parents[1]


def batch() -> SequenceBatch:
    """Rows 0 and 1 share the 3-token prompt [5, 6, 7] (left-padded to 4); row 2's is [8, 9].
    Answers: 2, 1 and 3 tokens."""
    prompts = torch.tensor([[0, 5, 6, 7], [0, 5, 6, 7], [0, 0, 8, 9]])
    prompt_mask = (torch.arange(4) >= torch.tensor([[1], [1], [2]])).long()
    answers = torch.tensor([[1, 2, 0], [3, 0, 0], [4, 5, 6]])
    answer_mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    return SequenceBatch(
        input_ids=torch.cat([prompts, answers], dim=1),
        attention_mask=torch.cat([prompt_mask, answer_mask.long()], dim=1),
        position_ids=torch.zeros(3, 7, dtype=torch.long),
        completion_mask=answer_mask,
        prompt_width=4,
    )


def test_prompts_count_once_answers_per_row_and_context_is_causal():
    shape = ModelShape(matmul_params=1000, layers=2, attention_width=8, hidden=8, intermediate=16)
    # tokens: prompts 3 + 2, answers 2 + 1 + 3 -> 11
    # context: prompts 3·4/2 + 2·3/2 = 9; answers (3+1)+(3+2) + (3+1) + (2+1)+(2+2)+(2+3) = 25
    needed, tokens = update_work(shape, batch(), torch.arange(3))
    assert tokens == 11
    assert needed == 6 * 1000 * 11 + 12 * 2 * 8 * (9 + 25)


def test_an_optimizer_step_counts_its_own_rows_and_their_distinct_prompts():
    """Rows 1 and 2 alone (another minibatch's step, or row 0 left out for a zero advantage):
    prompts 3 + 2 tokens, answers 1 + 3; context 6 + 3 = 9 for the prompts, (3+1) + (2+1) + (2+2)
    + (2+3) = 16 for the answers. Row 0 counted in a step of its own pays its prompt again."""
    shape = ModelShape(matmul_params=1000, layers=2, attention_width=8, hidden=8, intermediate=16)
    needed, tokens = update_work(shape, batch(), torch.tensor([1, 2]))
    assert tokens == 9
    assert needed == 6 * 1000 * 9 + 12 * 2 * 8 * (9 + 16)
    alone, alone_tokens = update_work(shape, batch(), torch.tensor([0]))
    assert alone_tokens == 3 + 2
    assert alone == 6 * 1000 * 5 + 12 * 2 * 8 * (6 + (3 + 1) + (3 + 2))


def test_the_benchmarks_count_another_trainers_step_with_the_same_formula():
    """scripts/benchstep/trl_side.py records TRL's inputs and counts them with needed_flops: the
    same batch as above, as TRL hands it over (prompt ids and masks, answer masks), gives the
    same FLOPs as the trainer's own count."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from benchstep.trl_side import StepClock

    shape = ModelShape(matmul_params=1000, layers=2, attention_width=8, hidden=8, intermediate=16)
    clock = StepClock(ROOT / "unused.jsonl")
    clock.shape = shape
    rows = batch()
    inputs = {
        "prompt_ids": rows.input_ids[:, :4],
        "prompt_mask": rows.attention_mask[:, :4],
        "completion_mask": rows.completion_mask.long(),
    }
    clock.record_inputs({k: v[:2] for k, v in inputs.items()})  # two micro-batches of one step:
    clock.record_inputs({k: v[2:] for k, v in inputs.items()})  # the shared prompt counts once
    assert clock.update_flops() == update_work(shape, rows, torch.arange(3))[0]


def test_the_shape_of_the_tiny_model(tiny_model):
    shape = model_shape(tiny_model)
    config = tiny_model.config
    total = sum(p.numel() for p in tiny_model.parameters())
    embedding = tiny_model.get_input_embeddings().weight
    tied = tiny_model.get_output_embeddings().weight is embedding
    assert shape.matmul_params == (total if tied else total - embedding.numel())
    assert shape.layers == config.num_hidden_layers
    assert shape.attention_width == config.num_attention_heads * (
        config.hidden_size // config.num_attention_heads
    )


def test_gpu_peaks_by_name_and_dtype(capsys):
    assert flops._gpu_peak("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert flops._gpu_peak("NVIDIA H100 PCIe", "fp32") == 51e12
    assert flops._gpu_peak("NVIDIA H200", "tf32") == 495e12
    assert flops._gpu_peak("NVIDIA A100-SXM4-80GB", "bf16") == 312e12
    assert flops._gpu_peak("Some Future GPU", "bf16") is None
    assert "no peak FLOP/s known for GPU 'Some Future GPU'" in capsys.readouterr().err


@pytest.mark.slow
def test_a_step_record_has_the_throughput(tmp_path):
    result = subprocess.run(
        [
            sys.executable, "-m", "tepo_cli", "train", "model=tiny", "trainer.max_steps=1",
            "trainer.eval_before=false", "trainer.eval_after=false", "trainer.save_final=false",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert record["update_flops"] > 0 and record["trained_tokens_per_second"] > 0
    assert record["update_mfu"] > 0 and math.isfinite(record["update_mfu"])
    assert record["peak_flops"] > 1e6 and record["update_mfu"] <= 1.0  # the tiny model: far below
    assert "MFU " in result.stdout + result.stderr  # the console: stderr when not a terminal


def test_mtp_modules_count_their_layer_projection_and_head_per_depth(tiny_model):
    """MPO's modules (mtp/modules.py): per depth, one decoder layer, the 2H → H projection and an
    LM head run every position again; the factor is 6 trained, 4 frozen with the gradient to the
    backbone, 2 with nothing flowing back."""
    from tepo_cli.algos.algo_config import MtpConfig
    from tepo_cli.config.schema import KernelConfig
    from tepo_cli.models.policy import Policy
    from tepo_cli.mtp.modules import attach
    from tepo_cli.train.flops import needed_flops, policy_shape

    config = tiny_model.config
    hidden, vocab = config.hidden_size, config.vocab_size
    layer = sum(p.numel() for p in tiny_model.model.layers[-1].parameters())
    norm = sum(p.numel() for p in tiny_model.model.norm.parameters())
    # per depth: two input norms + final norm (3 · norm), projection 2H·H, the layer, the head V·H
    per_depth = 3 * norm + 2 * hidden * hidden + layer + vocab * hidden
    backbone = model_shape(tiny_model)
    assert policy_shape(Policy(tiny_model, KernelConfig())) == backbone  # no modules: the backbone

    trained = policy_shape(Policy(tiny_model, KernelConfig(), attach=attach(3, MtpConfig())))
    assert (trained.attached_params, trained.attached_layers, trained.attached_passes) == (
        3 * per_depth,
        3,
        6.0,
    )
    shared = MtpConfig(head="shared", trainable=False)  # the head is the backbone's: counted too
    frozen = policy_shape(Policy(tiny_model, KernelConfig(), attach=attach(2, shared)))
    assert (frozen.attached_params, frozen.attached_passes) == (
        2 * (per_depth - vocab * hidden) + 2 * vocab * hidden,
        4.0,
    )
    detached = MtpConfig(trainable=False, backbone_grad=False)
    alone = policy_shape(Policy(tiny_model, KernelConfig(), attach=attach(2, detached)))
    assert alone.attached_passes == 2.0

    # one prompt of 3 tokens, one answer of 2: tokens 5, context 3·4/2 + (3+1) + (3+2) = 15
    one = (torch.tensor([3.0]), torch.tensor([2.0]), torch.tensor([3.0]))
    base, tokens = needed_flops(backbone, *one)
    width = backbone.attention_width
    assert tokens == 5
    assert base == 6 * backbone.matmul_params * 5 + 12 * backbone.layers * width * 15
    with_mtp, _ = needed_flops(trained, *one)
    assert with_mtp - base == 6.0 * (3 * per_depth * 5 + 2 * 3 * width * 15)
