"""Ray tasks: stateless agent calls."""
