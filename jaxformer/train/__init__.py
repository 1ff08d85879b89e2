"""Training: run configs, data, the causal-LM objective and the jitted train step."""
