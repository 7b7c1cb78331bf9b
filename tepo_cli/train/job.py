from omegaconf import DictConfig
from hydra.core.hydra_config import HydraConfig
from tepo_cli.config.validate import load_train_config

def train_job(cfg: DictConfig) -> None:
    c = load_train_config(cfg, HydraConfig.get().runtime.choices)
    print(c)
