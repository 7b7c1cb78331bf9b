def eval_job(cfg):
    print(cfg)
