"""Prompt text (templates/), reply parsing (parser.py) and context-window rendering (render.py)."""
