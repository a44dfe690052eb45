"""LLM providers behind one small protocol (see base.py)."""
