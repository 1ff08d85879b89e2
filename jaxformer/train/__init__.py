"""Training: run configs (run_config), data and objectives, the jitted steps (steps), checkpoints,
reporting (report), the run itself (run: ``train.py``), and what a finished run is used for (evaluate)."""
