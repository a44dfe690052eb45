"""stark-ray: STARK (Strategic Team of Agents for Refining Kernels), scalable on Ray."""

__version__ = "0.1.0"
