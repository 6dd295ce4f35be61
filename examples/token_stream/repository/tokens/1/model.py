"""Streams ``text_input`` back one word at a time, as an LLM streams tokens."""

import asyncio

import fastoip


class Tokens(fastoip.Model):
    async def predict(self, inputs, parameters):
        delay = float(parameters.get("delay", 0.0))  # seconds between tokens, to watch them arrive
        for word in inputs["text_input"][0].decode("utf-8").split():
            if delay:
                await asyncio.sleep(delay)
            yield {"text_output": [word]}  # one response, sent now
