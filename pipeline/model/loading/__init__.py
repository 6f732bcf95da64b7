"""Loading: a model spec to a keras-hub CausalLM. `sources.py` resolves specs and keeps the preset
cache (GGUF conversion by `gguf_convert.py` + `spm_proto.py`, adapter merges), and
`deferred_weights.py` builds a model without random initial weights. See pipeline/model/README.md.
"""
