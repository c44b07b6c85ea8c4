"""Integrations of libswiftkv with engines and frameworks; each is imported on its own
(``swiftkv.integrations.transformers`` needs torch and transformers)."""
