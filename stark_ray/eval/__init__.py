"""Evaluation of candidates: task loading, isolated workers, correctness, timing."""
