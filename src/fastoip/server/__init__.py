"""Frontends (gRPC, HTTP) and the app that wires them to the Core."""
