"""Evaluation on top of everything: the synthetic captioning suite, the demo pair's training, and benchmarks."""
