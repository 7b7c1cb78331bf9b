"""The public API (docs/objectives.md §4): presets, configs, registry, input checks, padding, edge cases."""

from __future__ import annotations

from importlib.resources import files

import pytest
import torch
import yaml
from omegaconf import OmegaConf
from pydantic import ValidationError

from tepo_cli.algos import (
    AlgoConfig,
    PolicyBatch,
    load_preset,
    policy_loss,
    preset_names,
    register_policy_loss,
    registered_policy_losses,
    resolve_algo,
)

F64 = torch.float64
PRESETS = ["grpo", "dapo", "gspo", "tepo", "mpo", "kl_cov", "clip_cov", "cispo", "sapo", "gmpo"]
# Presets callable without MTP inputs (the paper's `mpo` needs them: tests/test_algos_mpo.py).
LOSS_PRESETS = [name for name in preset_names() if name != "mpo"]


def inputs(rows: int = 4, columns: int = 7, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    shape = (rows, columns)
    logp = (-torch.rand(shape, generator=gen, dtype=F64) * 2 - 0.1).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(shape, generator=gen, dtype=F64)
    ref = logp.detach() + 0.3 * torch.randn(shape, generator=gen, dtype=F64)
    ent = torch.rand(shape, generator=gen, dtype=F64) * 2
    adv = torch.randn(rows, generator=gen, dtype=F64)
    lengths = torch.randint(1, columns + 1, (rows,), generator=gen)
    mask = torch.arange(columns) < lengths[:, None]  # right padding
    return logp, old, adv, mask, ref, ent


# presets ------------------------------------------------------------------------------------------
def test_every_knob_has_its_default_and_comment_in_one_place() -> None:
    """conf/algo/_base.yaml lists every knob (but the MTP modules', which only MPO's presets set),
    in the model's order, each with a comment; a preset states only its name and what differs."""
    folder = files("tepo_cli.conf") / "algo"
    base = (folder / "_base.yaml").read_text(encoding="utf-8")
    keys = [line.split(":")[0] for line in base.splitlines() if line and line[0] not in "# "]
    assert keys == [k for k in AlgoConfig.model_fields if k != "mtp"]
    for line in base.splitlines():
        assert line.startswith("#") or " # " in line, f"_base.yaml: no comment on {line!r}"
    assert "_base" not in preset_names()
    for name in preset_names():
        text = (folder / f"{name}.yaml").read_text(encoding="utf-8")
        lines = [line for line in text.splitlines() if line and not line.startswith("#")]
        assert lines[0].startswith("defaults:"), f"{name}.yaml starts from _base or a preset"
        for line in lines:
            assert " # " in line, f"{name}.yaml: no comment on {line!r}"
        assert set(load_preset(name)) >= set(keys), name
        parent = yaml.safe_load(text)["defaults"][0]
        inherited = load_preset(parent) if parent != "_base" else _base_values(base)
        for line in lines:
            key, _, value = line.partition("#")[0].partition(":")
            if line[0] == " " or key in ("defaults", "name", "mtp") or not value.strip():
                continue
            # a knob restated with its inherited value is noise, unless it cites its source
            marked = any(mark in line for mark in ("[paper]", "[our reading]", "[ours]"))
            assert marked or yaml.safe_load(value) != inherited[key], f"{name}.yaml: {line!r}"


def _base_values(text: str) -> dict[str, object]:
    return yaml.safe_load(text.replace("???", "'???'"))


def test_every_preset_is_shipped_registered_and_documented() -> None:
    assert set(PRESETS) <= set(preset_names())
    assert set(PRESETS) <= set(registered_policy_losses())
    for name in PRESETS:
        assert AlgoConfig.model_validate(load_preset(name)).name == name


def test_named_mpo_variants_derive_from_the_paper_preset() -> None:
    paper = load_preset("mpo")
    assert {"mpo_exact", "mpo_disjoint"} <= set(preset_names())
    exact = load_preset("mpo_exact")
    assert exact == {**paper, "future": "exact"}
    disjoint = load_preset("mpo_disjoint")
    changed = {"k": 4, "layout": "disjoint", "block_weights": "uniform", "future": "exact"}
    assert disjoint == {**paper, **changed}
    for name in ("mpo_exact", "mpo_disjoint"):
        text = (files("tepo_cli.conf") / "algo" / f"{name}.yaml").read_text(encoding="utf-8")
        for line in text.splitlines():
            assert line.startswith("#") or " # " in line, f"{name}.yaml: no comment on {line!r}"
        assert resolve_algo(name).name == "mpo"


def test_preset_table_of_section_1() -> None:
    cfg = {name: resolve_algo(name) for name in PRESETS}
    assert (cfg["grpo"].unit, cfg["grpo"].beta, cfg["grpo"].kl_estimator) == ("token", 0.04, "k3")
    assert cfg["grpo"].loss_agg == "seq-mean-token-mean" and cfg["grpo"].needs_ref
    dapo = cfg["dapo"]
    assert (dapo.eps_low, dapo.eps_high, dapo.loss_agg, dapo.beta) == (0.2, 0.28, "token-mean", 0)
    assert dapo.dynamic_sampling and dapo.overlong_penalty and not dapo.needs_ref
    gspo = cfg["gspo"]
    assert (gspo.unit, gspo.ratio_norm, gspo.eps_low, gspo.eps_high) == (
        "sequence",
        "mean",
        3e-4,
        4e-4,
    )
    assert gspo.loss_agg == "seq-mean-token-mean" and gspo.beta == 0
    tepo = cfg["tepo"]
    assert (tepo.unit, tepo.ratio_norm, tepo.route, tepo.loss_agg) == (
        "sequence",
        "mean",
        "token",
        "token-mean",
    )
    assert (tepo.kl_mask, tepo.beta, tepo.kl_estimator, tepo.eps_high) == ("tepo", 0.05, "k3", 0.28)
    assert tepo.needs_old_entropy and not tepo.needs_entropy
    mpo = cfg["mpo"]
    assert (mpo.unit, mpo.k, mpo.layout, mpo.ratio_norm, mpo.loss_agg, mpo.beta) == (
        "block",
        5,
        "sliding",
        "sum",
        "token-mean",
        0,
    )
    assert (mpo.block_weights, mpo.tail, mpo.future, mpo.mtp_depths) == (
        "decay:0.06,0.8",
        "drop",
        "mtp",
        4,
    )
    assert (mpo.eps_low, mpo.eps_high, mpo.mtp.head) == (0.2, 0.2, "copy")
    for name in ("grpo", "gspo", "tepo", "mpo"):
        assert not cfg[name].dynamic_sampling and not cfg[name].overlong_penalty


# configs: dict, DictConfig, AlgoConfig, overrides ------------------------------------------------
def test_algo_given_as_dict_dictconfig_or_model_equals_the_preset() -> None:
    logp, old, adv, mask, ref, _ = inputs()
    expected, _ = policy_loss("grpo", logp, old, adv, mask, ref_logp=ref)
    data = load_preset("grpo")
    for algo in (data, OmegaConf.create(data), AlgoConfig.model_validate(data)):
        got, _ = policy_loss(algo, logp, old, adv, mask, ref_logp=ref)
        assert torch.equal(got, expected)


def test_overrides_and_their_k_rules() -> None:
    assert resolve_algo("mpo", {"k": 8}).k == 8
    assert resolve_algo("mpo", {"k": 8}).mtp_depths == 7
    assert resolve_algo("mpo_disjoint", {"unit": "token"}).k is None  # k goes with its unit
    assert resolve_algo("dapo", {"unit": "block", "k": 4}).block_size == 4
    with pytest.raises(ValueError, match="set unit=block"):
        resolve_algo("grpo", {"k": 4})
    with pytest.raises(ValueError, match="unknown override kk"):
        resolve_algo("mpo", {"kk": 4})
    with pytest.raises(ValueError, match="no preset 'ppo'"):
        resolve_algo("ppo")
    with pytest.raises(ValueError, match="needs a 'name'"):
        resolve_algo({"unit": "token"})
    with pytest.raises(ValueError, match="algo must be"):
        resolve_algo(42)  # type: ignore[arg-type]


def test_block_of_one_and_unit_block_on_any_objective() -> None:
    logp, old, adv, mask, _, _ = inputs()
    token, _ = policy_loss("dapo", logp, old, adv, mask)
    block1, _ = policy_loss("dapo", logp, old, adv, mask, unit="block", k=1)
    block4, _ = policy_loss("dapo", logp, old, adv, mask, unit="block", k=4)
    assert torch.equal(token, block1)
    assert not torch.equal(token, block4)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"unit": "block"}, "needs a block size"),
        ({"unit": "sequence", "k": 2}, "set unit=block"),
        ({"layout": "sliding"}, "layout=sliding needs unit=block"),
        ({"block_weights": "future:0.5"}, "needs layout=sliding"),
        (
            {
                "unit": "block",
                "k": 2,
                "layout": "sliding",
                "block_weights": "geometric:0.5",
                "ratio_norm": "mean",
            },
            "use ratio_norm=sum",
        ),
        ({"block_weights": "future:2"}, "future:p"),
        ({"eps_low": 1.5}, "less than or equal to 1"),
        ({"dual_clip": 1.0}, "greater than 1"),
        ({"loss_agg": "mean"}, "token-mean"),
        ({"overlong_max_len": 10, "overlong_cache_len": 10}, "smaller than overlong_max_len"),
        ({"max_refill_rounds": 0}, "greater than or equal to 1"),
        ({"typo": 1}, "Extra inputs"),
        (
            {"unit": "block", "k": 5, "layout": "sliding", "block_weights": "decay:0.5,1.0"},
            r"beta_1 = -1 <= 0",
        ),
        ({"unit": "block", "k": 3, "block_weights": "decay:0.06"}, "decay:b,l"),
        ({"unit": "block", "k": 3, "future": "mtp"}, "future=mtp .* needs layout=sliding"),
        ({"tail": "cut"}, "drop"),
        ({"mask_criterion": "sign"}, "first_order"),
        ({"mtp": {"aux_coef": 0.1, "trainable": False}}, "mtp.trainable=false"),
        ({"mtp": {"warmup": {"alpha_decay": 0}}}, "greater than 0"),
    ],
)
def test_config_errors_name_the_problem(knobs: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        AlgoConfig.model_validate({"name": "grpo", **knobs})


def test_sliding_layout_with_weights_is_valid() -> None:
    cfg = AlgoConfig(name="mpo", unit="block", k=4, layout="sliding", block_weights="future:0.25")
    assert cfg.block_size == 4


# registry ------------------------------------------------------------------------------------------
def test_register_a_new_objective_and_reregistering_raises() -> None:
    name = "test_half_dapo"
    if name not in registered_policy_losses():

        @register_policy_loss(name)
        def half(batch: PolicyBatch, cfg: AlgoConfig):
            from tepo_cli.algos.objectives import clipped_policy_loss

            loss, metrics = clipped_policy_loss(batch, cfg)
            return loss / 2, metrics

    logp, old, adv, mask, _, _ = inputs()
    full, _ = policy_loss("dapo", logp, old, adv, mask)
    half_loss, _ = policy_loss({**load_preset("dapo"), "name": name}, logp, old, adv, mask)
    assert torch.allclose(half_loss, full / 2, rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("grpo")(lambda batch, cfg: None)
    with pytest.raises(ValueError, match="no policy loss registered under name 'nope'"):
        policy_loss({"name": "nope"}, logp, old, adv, mask)


# input checks --------------------------------------------------------------------------------------
def test_missing_inputs_raise_naming_the_argument() -> None:
    logp, old, adv, mask, ref, ent = inputs()
    with pytest.raises(ValueError, match="ref_logp is required"):
        policy_loss("grpo", logp, old, adv, mask)
    policy_loss("grpo", logp, old, adv, mask, beta=0.0)  # beta = 0 needs no reference
    policy_loss("grpo", logp, old, adv, mask, kl_target="old")  # nor does a KL to old
    with pytest.raises(ValueError, match="old_entropy is required"):
        policy_loss("tepo", logp, old, adv, mask, ref_logp=ref)
    with pytest.raises(ValueError, match="entropy is required"):
        policy_loss(
            "tepo",
            logp,
            old,
            adv,
            mask,
            ref_logp=ref,
            old_entropy=ent,
            mask_criterion="entropy_drop",
        )
    policy_loss("tepo", logp, old, adv, mask, beta=0.0)  # no KL: the mask is not needed
    with pytest.raises(ValueError, match="old_logp is required"):
        policy_loss("dapo", logp, None, adv, mask)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argument", "bad"),
    [
        ("logp", lambda x: x[0]),
        ("old_logp", lambda x: x[:, :-1]),
        ("mask", lambda x: x[:-1]),
        ("advantages", lambda x: x[:-1]),
        ("advantages", lambda x: x[:, None]),
        ("ref_logp", lambda x: x.T),
        ("old_entropy", lambda x: x[:, 1:]),
    ],
)
def test_shape_mismatch_raises_naming_the_argument(argument: str, bad) -> None:
    logp, old, adv, mask, ref, ent = inputs()
    args = {"logp": logp, "old_logp": old, "advantages": adv, "mask": mask}
    kwargs = {"ref_logp": ref, "old_entropy": ent}
    if argument in args:
        args[argument] = bad(args[argument])
    else:
        kwargs[argument] = bad(kwargs[argument])
    with pytest.raises(ValueError, match=f"^{argument} must"):
        policy_loss("tepo", *args.values(), **kwargs)


def test_bad_mask_values_and_normalisers() -> None:
    logp, old, adv, mask, _, _ = inputs()
    policy_loss("dapo", logp, old, adv, mask.long())  # 0/1 integers are fine
    with pytest.raises(ValueError, match="only 0 and 1"):
        policy_loss("dapo", logp, old, adv, mask.long() * 2)
    for name in ("num_tokens", "num_seqs", "max_len"):
        with pytest.raises(ValueError, match=f"{name} must be a positive number"):
            policy_loss("dapo", logp, old, adv, mask, **{name: 0})
    loss, _ = policy_loss("dapo", logp, old, adv, mask, num_tokens=torch.tensor(100))
    assert loss.dim() == 0


# padding side, tiny batches, empty masks ----------------------------------------------------------
def _left_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Move each row's first `length` entries to the end of the row (right → left padding)."""
    out = torch.zeros_like(x)
    columns = x.shape[1]
    for b, n in enumerate(lengths.tolist()):
        out[b, columns - n :] = x[b, :n]
    return out


@pytest.mark.parametrize(
    ("preset", "extra"),
    [(p, {}) for p in LOSS_PRESETS]
    + [("mpo_disjoint", {"k": 3}), ("mpo_exact", {"k": 3, "tail": "renormalise"})],
)
def test_left_and_right_padding_give_identical_results(preset: str, extra: dict) -> None:
    logp, old, adv, mask, ref, ent = inputs(rows=5, columns=8, seed=3)
    lengths = mask.sum(1)
    right, right_metrics = policy_loss(
        preset, logp, old, adv, mask, ref_logp=ref, old_entropy=ent, **extra
    )
    (right_grad,) = torch.autograd.grad(right, logp)
    left_logp = _left_padded(logp.detach(), lengths).requires_grad_(True)
    left, left_metrics = policy_loss(
        preset,
        left_logp,
        _left_padded(old, lengths),
        adv,
        _left_padded(mask, lengths),
        ref_logp=_left_padded(ref, lengths),
        old_entropy=_left_padded(ent, lengths),
        **extra,
    )
    (left_grad,) = torch.autograd.grad(left, left_logp)
    torch.testing.assert_close(left, right, rtol=0, atol=1e-14)
    torch.testing.assert_close(left_grad, _left_padded(right_grad, lengths), rtol=0, atol=1e-14)
    assert left_metrics == pytest.approx(right_metrics, abs=1e-12)


@pytest.mark.parametrize("preset", LOSS_PRESETS)
def test_single_row_and_single_token(preset: str) -> None:
    logp, old, adv, mask, ref, ent = inputs(rows=1, columns=1)
    loss, metrics = policy_loss(preset, logp, old, adv, mask, ref_logp=ref, old_entropy=ent)
    assert torch.isfinite(loss) and loss.shape == ()
    assert set(metrics) >= {"clip_frac", "kl", "ratio_mean", "pg_loss", "kl_loss"}


def test_empty_tepo_mask_gives_exactly_zero_kl() -> None:
    logp, old, _, mask, ref, ent = inputs()
    adv = -torch.rand(4, dtype=F64)  # no positive advantage: the mask is empty
    loss, metrics = policy_loss("tepo", logp, old, adv, mask, ref_logp=ref, old_entropy=ent)
    no_kl, _ = policy_loss("tepo", logp, old, adv, mask, beta=0.0)
    assert metrics["kl_mask_frac"] == 0.0 and metrics["kl_loss"] == 0.0
    assert torch.equal(loss, no_kl)


@pytest.mark.parametrize("preset", LOSS_PRESETS)
def test_batch_without_any_response_token(preset: str) -> None:
    logp, old, adv, mask, ref, ent = inputs()
    empty = torch.zeros_like(mask)
    loss, metrics = policy_loss(preset, logp, old, adv, empty, ref_logp=ref, old_entropy=ent)
    (grad,) = torch.autograd.grad(loss, logp)
    assert float(loss.detach()) == 0.0 and torch.all(grad == 0)
    assert metrics["clip_frac"] == 0.0 and metrics["kl"] == 0.0
