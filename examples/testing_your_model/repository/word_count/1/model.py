"""Counts the words of each text and says whether it is shouted (all capitals)."""

import numpy as np

import fastoip


class WordCount(fastoip.Model):
    def predict(self, inputs, parameters):
        texts = [value.decode("utf-8") for value in inputs["TEXT"].reshape(-1)]
        if any(not text.strip() for text in texts):
            raise fastoip.InvalidArgument("TEXT must not be empty")
        words = np.array([[len(text.split())] for text in texts], dtype=np.int64)
        shouting = np.array([[text.isupper()] for text in texts], dtype=bool)
        return {"WORDS": words, "SHOUTING": shouting}
