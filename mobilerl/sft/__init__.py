"""Supervised fine-tuning: the LLaMA-Factory runner and reasoning bootstrap / iterative refinement."""
