"""Supervised fine-tuning: the LLaMA-Factory runner (llamafactory), one SFT run of a profile (train), and the
reasoning set's bootstrap (bootstrap) and iterative refinement (refine) on the shared pieces (reasoning)."""
