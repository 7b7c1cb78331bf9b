"""`tepo train`: validate the composed config, then run (or re-launch as several ranks)."""

from __future__ import annotations

import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from tepo_cli.config.errors import ConfigError, RunError
from tepo_cli.config.validate import load_train_config


def train_job(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        config = load_train_config(cfg, hydra_cfg.runtime.choices)
        from tepo_cli.algos.plugins import load_objectives

        load_objectives(config.plugins, config.algo.name)
        from tepo_cli.train import distributed

        if config.trainer.nproc > 1 and not distributed.launched_by_launcher():
            code = distributed.relaunch(
                config.trainer.nproc, list(hydra_cfg.overrides.task), run_dir
            )
            if code:
                sys.exit(code)
            return
        topo = distributed.setup_topology(config.trainer.num_threads)
        if topo.world_size > 1 and config.trainer.prompts_per_step % topo.world_size:
            raise ConfigError(
                f"trainer.prompts_per_step={config.trainer.prompts_per_step} must be a multiple of "
                f"the number of ranks ({topo.world_size}): each rank takes whole groups."
            )
        if topo.is_main:
            (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(config.model_dump(mode="json")))
        from tepo_cli.train.loop import train

        train(config, run_dir, topo)
    except ConfigError as error:
        print(f"tepo train: {error}", file=sys.stderr)
        sys.exit(2)
    except RunError as error:
        print(f"tepo train: {error}", file=sys.stderr)
        sys.exit(1)
    finally:
        from tepo_cli.train.distributed import teardown

        teardown()
