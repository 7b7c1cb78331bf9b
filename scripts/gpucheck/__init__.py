"""scripts/gpu_check.py's parts."""
