"""Details of behaving like `transformers`' own `generate`."""
