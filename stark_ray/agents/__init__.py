"""The STARK agents: plan (grounded instructions), code, debug, and the single-agent ablation."""
