"""MPO's multi-token-prediction (MTP) modules, in one place (docs/objectives.md §1.5).

hook             the one way into a run: the recipe's calls (start line, model check, attach,
                 warm-up); everything else reaches the modules through the policy
modules          the modules (DeepSeek-V3 style), their scores, FLOPs, terms and final files
prediction_loss  L_MTP and the per-depth metrics
warmup           the modules trained alone before RL, the backbone frozen
warmup_size      how many warm-up steps `auto` gives a job
files            the modules' file beside final/, and the early model check
"""
