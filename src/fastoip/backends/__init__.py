"""Backends execute a model on already-validated, already-batched numpy inputs."""
