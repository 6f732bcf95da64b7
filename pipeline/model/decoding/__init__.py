"""Decoding: from a loaded keras-hub Gemma to labels, summaries and replies.

`one_pass.py` (the engine of a model tuned by ChatLens: the default) and `prompted.py` (any
other model) on the shared pieces: `step.py` (the one-token step and the caches), `state.py`
(the stateless-scope helper and the tokenizer), `buckets.py` (batch and length buckets,
padding), `programs.py` (the compiled programs held), `text.py` (clean-up of generated text),
`grounding.py` (numbers only from the chat), `answer_vocabulary.py` (the tokens a tuned model
may write), `calibration.py` (a tuned model's label calibration); beside them `extractive.py`,
summaries that only quote the chat. See pipeline/model/README.md.
"""
