"""On CPU, grouped-query attention reads the shared key/value heads in place (no repeat_kv copies),
with the same outputs and gradients as the copying path."""

from __future__ import annotations

import inspect

import pytest
import torch
import transformers.integrations.sdpa_attention as sdpa_attention

HAS_SWITCH = "TRANSFORMERS_SDPA_FORCE_GQA" in inspect.getsource(sdpa_attention)


@pytest.mark.skipif(not HAS_SWITCH, reason="this transformers has no in-place GQA switch")
def test_cpu_attention_with_padding_does_not_copy_kv_heads_and_matches(
    tiny_model, tiny_tokenizer, monkeypatch
):
    assert tiny_model.config.num_key_value_heads < tiny_model.config.num_attention_heads
    tiny_model.double()
    encoded = tiny_tokenizer(
        ["Hi", "What is 7*8? Answer with just the number."],
        return_tensors="pt",
        padding=True,
        add_special_tokens=False,
    )
    assert encoded["attention_mask"].eq(0).any(), "the batch must be padded (a mask is passed)"
    copies = []
    original_repeat = sdpa_attention.repeat_kv
    monkeypatch.setattr(
        sdpa_attention, "repeat_kv", lambda *a: copies.append(1) or original_repeat(*a)
    )

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        tiny_model.zero_grad(set_to_none=True)
        logits = tiny_model(**encoded).logits
        (logits * encoded["attention_mask"][..., None]).square().sum().backward()
        return logits.detach(), tiny_model.model.layers[0].self_attn.k_proj.weight.grad.clone()

    in_place = run()  # load_model (conftest) set the switch for CPU
    assert copies == []
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "0")
    copied = run()
    assert copies, "with the switch off transformers copies the heads"
    real = encoded["attention_mask"].bool()
    torch.testing.assert_close(in_place[0][real], copied[0][real], rtol=0, atol=1e-12)
    torch.testing.assert_close(in_place[1], copied[1], rtol=1e-9, atol=1e-12)
