"""Ray actors: thin shells over the core (TreeMemory, EvalService)."""
