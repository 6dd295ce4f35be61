"""OpenAI's API (``/v1/models``, ``/v1/embeddings``, ``/v1/completions``, ``/v1/chat/completions``): its JSON <->
core types, sans-I/O.

Modules, one job each:
- :mod:`.errors`: OpenAI's error body and the 400 that names the bad parameter;
- :mod:`.fields`: reading and checking a request's JSON members;
- :mod:`.requests`: the three request bodies, parsed and checked into typed records;
- :mod:`.contract`: Triton's LLM tensor contract (``text_input`` ... ``text_output``) for a request and its answers;
- :mod:`.chat`: chat messages -> the prompt, through the model's Jinja chat template;
- :mod:`.stops`: stop strings over a stream of text deltas;
- :mod:`.tools`: tool-call parsers (pluggable) that find tool calls in a model's text;
- :mod:`.answers`: completion, chat and chunk bodies, usage, Server-Sent Events;
- :mod:`.embeddings`: embedding requests as tensors (text models, tokenised encoders) and their answers.
"""
