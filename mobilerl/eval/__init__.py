"""Evaluation: metrics (pass@k, buckets, AndroidLab), the benchmark runner, offline AndroidControl step
evaluation, checkpoint policies and the report."""
