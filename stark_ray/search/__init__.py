"""The search core (no Ray): tree memory, policies, context windows and Algorithm 1."""
