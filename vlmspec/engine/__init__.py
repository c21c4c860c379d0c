"""The model-agnostic decoding engine: tree, drafting, verification, cache bookkeeping and the loop."""
