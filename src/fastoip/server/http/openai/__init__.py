"""OpenAI's API on the HTTP frontend, translating only: the JSON forms are :mod:`fastoip.wire.openai`, every request
runs through the Core (``Core.start`` / ``Core.infer_async``), so the dynamic batcher, statistics and traces see it
as any other request.

Modules: :mod:`.calls` (one model call's answers on the loop), :mod:`.templates` (a model's chat template, read
from its folder), :mod:`.generation` (completions and chat, streamed or not), :mod:`.endpoints` (the handlers and
where they are mounted), :mod:`.frontend` (the API alone on its own port, ``--openai-port``).
"""
