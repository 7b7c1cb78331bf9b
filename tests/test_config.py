"""Config validation: every bad value stops the run with one paragraph naming key, value, rule."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tepo_cli.config.validate import load_eval_config, load_train_config
from tepo_cli.core.errors import ConfigError


def test_default_train_config_is_valid(compose_config):
    config = load_train_config(compose_config("train"))
    assert config.algo.name == "grpo"
    assert config.algo.beta == pytest.approx(0.04)
    assert config.rollout.n == 8
    assert config.model.name == "smollm2_135m"
    assert config.trainer.lr == pytest.approx(1e-5)


def test_default_eval_config_is_valid(compose_config):
    config = load_eval_config(compose_config("eval"))
    assert config.eval.greedy and config.eval.n == 1


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "rollout.n=1",
            ["advantage=grpo compares each response", "rollout.n >= 2", "got rollout.n=1"],
        ),
        ("advantage=rloo rollout.n=1", ["advantage=rloo compares each response", "rollout.n=1"]),
        (
            "advantage=rloo +advantage.scale=none",
            ["advantage.scale do not apply to advantage=rloo"],
        ),
        (
            "advantage=reinforce_pp rollout.n=1",
            ["advantage=reinforce_pp compares each response", "(or advantage.baseline=none)"],
        ),
        (
            "+advantage.baseline=none",
            ["advantage.baseline do not apply to advantage=grpo", "reinforce_pp: baseline"],
        ),
        ("advantage=gae advantage.gamma=1.5", ["advantage.gamma=1.5", "less than or equal to 1"]),
        ("advantage=gae advantage.value_clip=0", ["advantage.value_clip=0", "greater than 0"]),
        ("algo=dapo advantage=gae rollout.n=1", ["algo.dynamic_sampling drops the prompts"]),
        (
            "advantage.scale=rank",
            ["advantage.scale='rank'", "'std', 'batch' or 'none'", "conf/advantage/grpo.yaml"],
        ),
        (
            "algo.eps_low=-1",
            ["algo.eps_low=-1", "greater than or equal to 0", "conf/algo/grpo.yaml"],
        ),
        ("trainer.lr=abc", ["trainer.lr='abc'", "valid number", "conf/train.yaml"]),
        ("trainer.lr=0", ["trainer.lr=0", "greater than 0"]),
        ("algo.unit=blocks", ["algo.unit='blocks'", "'token', 'block' or 'sequence'"]),
        ("algo.loss_agg=mean", ["algo.loss_agg='mean'", "'token-mean'"]),
        ("+trainer.lrr=1", ["unknown key 'trainer.lrr'", "Did you mean 'trainer.lr'?"]),
        ("+foo=1", ["unknown key 'foo'", "at the top level"]),
        ("deepspeed.stage=4", ["deepspeed.stage=4", "less than or equal to 3"]),
        ("k=0", ["k=0", "greater than or equal to 1"]),
        ("trainer.prompts_per_step=3 trainer.nproc=2", ["multiple of trainer.nproc"]),
        ("algo=dapo reward.correct=-1", ["reward.correct (-1.0) must be larger", "(-1.0)"]),
    ],
)
def test_bad_values_name_key_value_and_rule(compose_config, override, expected):
    with pytest.raises(ConfigError) as caught:
        load_train_config(
            compose_config("train", override.split()),
            {"algo": "grpo", "rollout": "hf", "advantage": "grpo"},
        )
    message = str(caught.value)
    assert "\n" not in message
    for fragment in expected:
        assert fragment in message, message


def test_several_problems_are_reported_together(compose_config):
    with pytest.raises(ConfigError, match=r"\(2 problems\)"):
        load_train_config(compose_config("train", ["algo.eps_low=-1", "trainer.lr=abc"]))


@pytest.mark.parametrize("algo", ["grpo", "dapo", "gspo", "tepo", "mpo"])
def test_top_level_k_makes_any_objective_block_level(compose_config, algo):
    config = load_train_config(compose_config("train", [f"algo={algo}", "k=4"]))
    assert (config.algo.unit, config.algo.k, config.algo.block_size) == ("block", 4, 4)


def test_mpo_is_the_papers_form_and_k_sets_its_window(compose_config):
    config = load_train_config(compose_config("train", ["algo=mpo"]))
    algo = config.algo
    assert (algo.unit, algo.k, algo.layout, algo.future, algo.mtp_depths) == (
        "block",
        5,
        "sliding",
        "mtp",
        4,
    )
    config = load_train_config(compose_config("train", ["algo=mpo", "k=4"]))
    assert (config.algo.k, config.algo.mtp_depths, config.algo.block_weights) == (
        4,
        3,
        "decay:0.06,0.8",
    )


def test_cross_field_errors_name_the_group_not_its_whole_dict(compose_config):
    with pytest.raises(ConfigError) as caught:
        load_train_config(compose_config("train", ["algo.unit=block"]), {"algo": "grpo"})
    message = str(caught.value)
    assert message.startswith("Invalid configuration: algo: ") and "{" not in message


def _tepo(*args: str, cwd: Path, **env_vars: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HYDRA_FULL_ERROR="0", **env_vars)
    return subprocess.run(
        [sys.executable, "-m", "tepo_cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["train", "algo=nope"], "algo=nope: there is no algo preset 'nope'"),
        (["train", "rollout.n=1"], "advantage=grpo compares each response with the other"),
        (
            ["train", "advantage=ppo"],
            "the choices of advantage are: gae, grpo, reinforce_pp, rloo.",
        ),
        (["train", "advantage=gae", "advantage.gamma=1.5"], "advantage.gamma=1.5 is not allowed"),
        (["train", "advantage=rloo", "rollout.n=1"], "advantage=rloo compares each response"),
        (["train", "algo.eps_low=-1"], "algo.eps_low=-1 is not allowed"),
        (["train", "trainer.lr=abc"], "trainer.lr='abc' is not allowed"),
        (["train", "kernel.tf32=fast"], "kernel.tf32='fast' is not allowed: must be auto, true"),
        (
            ["train", "badkey=1"],
            "unknown key 'badkey' in `tepo train`; the keys allowed at the top",
        ),
        (["train", "-m", "trainer.lrr=1,2"], "Did you mean 'trainer.lr'?"),
        (["train", "+badkey=1"], "unknown key 'badkey'"),
        (["eval", "eval.n=4"], "eval.n > 1 needs sampling"),
        (["frobnicate"], "unknown command 'frobnicate'"),
        (  # Hydra's grammar refuses '~' unquoted: the override is named with the quoting
            ["train", "benchmark=custom", "benchmark.path=~/data"],
            "'benchmark.path=~/data' is not an override Hydra can read (LexerNoViableAltException"
            ": benchmark.path=~/data). Put the value in quotes, inside the shell's: "
            "\"benchmark.path='~/data'\"",
        ),
    ],
)
def test_cli_rejects_bad_input_without_traceback(tmp_path, args, fragment):
    result = _tepo(*args, cwd=tmp_path)
    assert result.returncode != 0
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert list(tmp_path.iterdir()) == []  # no partial output: not even Hydra's run directory


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["train", "trainer.lr=-1"], "trainer.lr=-1 is not allowed"),
        (["eval", "eval.n=4"], "eval.n > 1 needs sampling"),
    ],
)
def test_a_refused_value_loads_neither_torch_nor_transformers(tmp_path, args, fragment):
    """A mistaken value is refused before torch, transformers or DeepSpeed load: their imports
    would take most of the time a user waits for the paragraph (docs/patches.md)."""
    command = [sys.executable, "-X", "importtime", "-m", "tepo_cli", *args]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert fragment in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    imported = {line.rsplit("|", 1)[-1].strip() for line in lines}
    assert "tepo_cli.config.schema" in imported  # the record is the command's own
    assert not imported & {"torch", "transformers", "deepspeed"}


@pytest.mark.slow
def test_cli_help_and_cfg_job(tmp_path):
    top = _tepo("--help", cwd=tmp_path)
    assert top.returncode == 0 and "tepo train" in top.stdout
    hydra_help = _tepo("train", "--help", cwd=tmp_path)
    assert (
        hydra_help.returncode == 0
        and "algo: _base, cispo, clip_cov, dapo, gmpo, grpo, gspo, kl_cov, mpo, mpo_disjoint, mpo_exact, sapo, tepo"
        in hydra_help.stdout
    )

    job = _tepo("train", "algo.eps_high=0.28", "--cfg", "job", cwd=tmp_path)
    assert job.returncode == 0 and "eps_high: 0.28" in job.stdout


def _one_paragraph_exit_2(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    message = result.stderr.strip()
    assert "Traceback" not in result.stderr + result.stdout
    assert "\n" not in message.split("tepo train: ", 1)[-1].strip(), message
    for fragment in fragments:
        assert fragment in message, message
    return message


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (
            ["algo=mpo", "k=5", "algo.block_weights=decay:0.5,1.0"],
            ["algo: block_weights=decay:0.5,1.0 with k=5", "beta_1 = -1 <= 0"],
        ),
        (["algo=mpo", "k=0"], ["k=0 is not allowed", "greater than or equal to 1"]),
        (["algo=mpo", "algo.future=mtp", "algo.layout=disjoint"], ["needs layout=sliding"]),
    ],
)
def test_mpo_bad_input_is_one_paragraph_and_exit_2(tmp_path, args, fragments):
    result = _tepo("train", "model=tiny", f"hydra.run.dir={tmp_path / 'run'}", *args, cwd=tmp_path)
    _one_paragraph_exit_2(result, *fragments)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    assert not (tmp_path / "run" / "config.yaml").exists()


@pytest.mark.slow
def test_mtp_on_an_architecture_that_cannot_carry_it_names_the_supported_ones(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    model_dir = tmp_path / "gpt2"
    config = GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=64)
    GPT2LMHeadModel(config).save_pretrained(model_dir)
    run_dir = tmp_path / "run"
    args = ["model=hf", f"model.path={model_dir}", "model.tokenizer=smollm2_135m", "algo=mpo"]
    result = _tepo("train", f"hydra.run.dir={run_dir}", *args, cwd=tmp_path)
    _one_paragraph_exit_2(
        result,
        "algo.future=mtp attaches MTP modules",
        "architecture is 'gpt2'",
        "llama, mistral, qwen2, qwen3",
        "algo.future=exact",
    )
    assert not (run_dir / "config.yaml").exists() and not (run_dir / "metrics.jsonl").exists()


def test_decay_weights_are_typed_as_the_paper_writes_them():
    from tepo_cli.config.overrides import quote_weight_specs

    assert quote_weight_specs(["algo.block_weights=decay:0.04,0.9", "k=4"]) == [
        "algo.block_weights='decay:0.04,0.9'",
        "k=4",
    ]
    untouched = ["algo.block_weights=uniform,future:0.3", "algo.block_weights='decay:1,2'"]
    assert quote_weight_specs(untouched) == untouched  # a sweep, and an already quoted value


@pytest.mark.slow
def test_decay_weights_reach_the_config_from_the_command_line(tmp_path):
    job = _tepo(
        "train", "algo=mpo", "algo.block_weights=decay:0.04,0.9", "--cfg", "job", cwd=tmp_path
    )
    assert job.returncode == 0, job.stderr
    assert "block_weights: decay:0.04,0.9" in job.stdout


def test_entropy_drop_needs_more_than_one_update_per_rollout(compose_config):
    overrides = ["algo=tepo", "algo.mask_criterion=entropy_drop"]
    with pytest.raises(ConfigError, match="the KL mask would always be empty"):
        load_train_config(compose_config("train", overrides))
    config = load_train_config(compose_config("train", [*overrides, "trainer.ppo_epochs=2"]))
    assert config.algo.needs_entropy


@pytest.mark.parametrize(
    ("choice", "name"), [([], "grpo"), (["advantage=rloo"], "rloo"), (["advantage=gae"], "gae")]
)
def test_the_advantage_group_picks_the_estimator(compose_config, choice, name):
    config = load_train_config(compose_config("train", choice))
    assert config.advantage.name == name and config.rollout.n == 8
    assert config.advantage.needs_critic == (name == "gae")
    assert "advantage_scale" not in config.algo.model_dump()  # the loss no longer holds it


def test_gae_takes_one_response_per_prompt(compose_config):
    config = load_train_config(compose_config("train", ["advantage=gae", "rollout.n=1"]))
    advantage = config.advantage
    assert (advantage.gamma, advantage.lam, advantage.value_clip, advantage.critic_lr) == (
        1.0,
        1.0,
        0.5,
        1e-5,
    )


@pytest.mark.slow
def test_trainer_nproc_must_match_the_launchers_world_size(tmp_path):
    """Started by a launcher (RANK and WORLD_SIZE set) as one rank, but told trainer.nproc=2."""
    run_dir = tmp_path / "run"
    launched = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    launched["MASTER_PORT"] = "1"  # never dialled: the check comes before any process group
    result = _tepo(
        "train",
        "model=tiny",
        "trainer.nproc=2",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
        **launched,
    )
    assert result.returncode == 2
    assert "trainer.nproc=2, but the launcher started 1 rank(s)" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (run_dir / "config.yaml").exists()


def test_the_base_of_the_algo_presets_is_not_an_objective():
    from tepo_cli.algos.plugins import load_objectives

    with pytest.raises(
        ConfigError, match=r"algo=_base holds the default of every objective knob.*algo=grpo"
    ):
        load_objectives([], "???")  # conf/algo/_base.yaml's name


@pytest.mark.parametrize(
    ("overrides", "correct", "incorrect"),
    [
        ([], 1.0, 0.0),
        (["algo=dapo"], 1.0, -1.0),
        (["algo=dapo", "reward=math", "benchmark=math"], 1.0, -1.0),
        (["algo=dapo", "reward.incorrect=0"], 1.0, 0.0),
        (["algo=grpo", "reward.correct=2"], 2.0, 0.0),
    ],
)
def test_the_correctness_reward_lives_in_the_reward_group_and_dapo_sets_it(
    compose_config, overrides, correct, incorrect
):
    """DAPO's ±1 is merged into `reward.*` whatever the reward group; the command line wins."""
    config = load_train_config(compose_config("train", overrides))
    assert (config.reward.correct, config.reward.incorrect) == (correct, incorrect)
    assert "reward_correct" not in config.algo.model_dump()


ROUND_TRIPS = [
    *([f"algo={name}"] for name in ("grpo", "dapo", "gspo", "tepo", "mpo", "mpo_exact")),
    ["advantage=rloo"],
    ["advantage=gae", "rollout.n=1", "advantage.critic_lr=3e-5"],
    ["advantage.scale=none", "benchmark.eval_size=7"],
    ["benchmark=math500", "reward=math", "algo=mpo", "k=3"],
    ["benchmark=gsm8k", "model.lora.r=8", "deepspeed=zero3"],
    *([f"recipe={name}"] for name in ("dapo_math", "mpo_paper", "cpu_compare")),
]


@pytest.mark.parametrize("overrides", ROUND_TRIPS, ids=" ".join)
def test_a_runs_config_yaml_validates_again_as_written(compose_config, overrides):
    """config.yaml (the dump a run writes) is a config: scripts and `resume` read it back."""
    import yaml
    from omegaconf import OmegaConf

    config = load_train_config(compose_config("train", overrides))
    written = OmegaConf.to_yaml(config.model_dump(mode="json"))  # as train/train_job.py writes it
    again = load_train_config(yaml.safe_load(written))
    assert again.model_dump(mode="json") == config.model_dump(mode="json")
    assert again == config


def test_an_auto_engine_length_holds_a_long_prompt_beside_the_longest_answer(compose_config):
    """rollout.engine.max_model_len=auto: 2,048 prompt tokens + the answer limit the job asks for,
    in training (rollout.max_new_tokens) and in `tepo eval` (eval.max_new_tokens, else the
    benchmark's); a number given stays."""

    def length(config):
        return config.rollout.engine.max_model_len

    train = ["rollout=vllm", "benchmark=math500"]
    assert length(load_train_config(compose_config("train", train))) == 1024 + 2048
    longer = [*train, "rollout.max_new_tokens=2048"]
    assert length(load_train_config(compose_config("train", longer))) == 4096
    fixed = [*train, "rollout.engine.max_model_len=3000"]
    assert length(load_train_config(compose_config("train", fixed))) == 3000
    assert length(load_eval_config(compose_config("eval", ["rollout=vllm"]))) == 16 + 2048
    evaluation = ["rollout=vllm", "benchmark=gsm8k", "eval.max_new_tokens=300"]
    assert length(load_eval_config(compose_config("eval", evaluation))) == 300 + 2048
